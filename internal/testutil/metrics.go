package testutil

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// HistogramTotals collects reader and returns the sum and count of the
// points of the float64 histogram name whose attributes match keep (nil
// keeps every point).
func HistogramTotals(t testing.TB, reader sdkmetric.Reader, name string, keep func(attribute.Set) bool) (sum float64, count uint64) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			h, ok := m.Data.(metricdata.Histogram[float64])
			if !ok || m.Name != name {
				continue
			}
			for _, p := range h.DataPoints {
				if keep == nil || keep(p.Attributes) {
					sum, count = sum+p.Sum, count+p.Count
				}
			}
		}
	}
	return sum, count
}
