// Talks to: no service. The SQS SDK's requests go to a loopback port
// nothing listens on.
package urltest

import (
	"context"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
)

// offlineAWS points the AWS SDK at nothing outside the process: static
// credentials, no shared files, no instance metadata, one attempt per call.
func offlineAWS(t testing.TB) {
	t.Helper()
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_SESSION_TOKEN": "",
		"AWS_PROFILE": "", "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
		"AWS_EC2_METADATA_DISABLED": "true", "AWS_MAX_ATTEMPTS": "1",
	} {
		t.Setenv(k, v)
	}
}

// openAll opens raw as a publisher, as a consumer and with Inspect, and
// returns what each failed with, by name; it fails t when one opens.
func openAll(t *testing.T, raw string) map[string]error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	errs := map[string]error{}
	var err error
	if _, err = dedupq.OpenPublisher(ctx, raw, dedupq.PublisherOptions{}); err != nil {
		errs["OpenPublisher"] = err
	}
	if _, err = dedupq.OpenConsumer(ctx, raw, dedupq.ConsumerOptions{}); err != nil {
		errs["OpenConsumer"] = err
	}
	if _, err = dedupq.Inspect(ctx, raw, dedupq.InspectOptions{}); err != nil {
		errs["Inspect"] = err
	}
	if len(errs) != 3 {
		t.Fatalf("%q opened: errors %v, want all three to fail", raw, errs)
	}
	return errs
}

// TestSQSEndpointNeverShown (issue 23, defect 7): the SDK quotes the
// endpoint in its errors, path included; the endpoint is hidden wherever
// the marker is in it.
func TestSQSEndpointNeverShown(t *testing.T) {
	offlineAWS(t)
	addr := refusingAddr(t)
	for _, endpoint := range []string{
		"http://" + addr + "/" + marker,
		"http://" + addr + "/v1/" + marker + "/",
		"http://" + addr + "/a%21" + marker,
		"HTTP://" + addr + "/" + marker,
	} {
		for _, raw := range []string{
			"sqs://q.fifo?region=eu-west-1&endpoint=" + endpoint,
			"sqs://" + addr + "/000000000000/q.fifo?region=eu-west-1&endpoint=" + endpoint,
		} {
			t.Run(raw, func(t *testing.T) {
				for what, err := range openAll(t, raw) {
					if s := showsMarker(err); s != "" {
						t.Errorf("%s shows the endpoint: %s", what, s)
					}
				}
			})
		}
	}
}
