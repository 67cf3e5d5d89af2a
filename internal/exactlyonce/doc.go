// Package exactlyonce holds no code, only a test: a seeded, fake-clock
// simulation that treats dedupq's startup checks (window.CheckPublisher and
// window.CheckConsumer) as a theorem. Whenever both accept a plan, no
// schedule the declared policies allow may run a message's effect twice;
// whenever one refuses at margin zero, some schedule must; ordered groups
// included, with the head-of-line wait behind the group's backlog. See
// property_test.go; relay_property_test.go does the same for the outbox
// relay's Span, with the real outbox.Relay on PostgreSQL.
package exactlyonce
