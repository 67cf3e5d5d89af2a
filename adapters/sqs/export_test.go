// Test-only exports: the SDK seam, so that the external tests can wrap the
// client (to count or break requests) without it being part of the API.
package sqs

import "context"

// API is the seam the tests wrap *sqs.Client with.
type API = sqsAPI

// OpenTopicAPI is OpenTopic over any API.
func OpenTopicAPI(ctx context.Context, api API, queueURL string, opts *Options) (*Topic, error) {
	return openTopic(ctx, api, queueURL, opts)
}

// OpenSubscriptionAPI is OpenSubscription over any API.
func OpenSubscriptionAPI(ctx context.Context, api API, queueURL string, opts *Options) (*Subscription, error) {
	return openSubscription(ctx, api, queueURL, opts)
}
