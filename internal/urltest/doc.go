// Package urltest holds only tests: the cross-adapter check that no error
// an adapter's URL opener returns shows a secret from the URL. It imports
// every adapter, which the root package's own tests cannot do without an
// import cycle.
package urltest
