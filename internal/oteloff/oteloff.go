// Package oteloff holds providers that switch dedupq's telemetry off
// entirely, not merely to no-op instruments: given either, the consumer and
// the Guard make no OpenTelemetry call at all for that signal. Benchmarks
// use them as the baseline that the overhead of each real provider is a
// ratio of; being internal, they are no option a user can reach (a user
// gets the same effect from the API's no-op providers, which dedupq
// recognises too).
package oteloff

import (
	mnoop "go.opentelemetry.io/otel/metric/noop"
	tnoop "go.opentelemetry.io/otel/trace/noop"
)

// MeterProvider switches metrics off.
type MeterProvider struct{ mnoop.MeterProvider }

// TracerProvider switches tracing off.
type TracerProvider struct{ tnoop.TracerProvider }
