package main

// Runs the program against an SQS FIFO queue (with a dead-letter queue) in
// the fauxqs emulator (localstack/fauxqs), which the test starts, and
// installs from its lockfile if needed. Skipped outside CI when node or
// npm is missing; failed under CI.

import (
	"context"
	"testing"
	"time"

	"github.com/dedupq/dedupq/examples/internal/need"
)

func TestRun(t *testing.T) {
	client, queueURL, _ := need.SQSQueue(t, "example-sqs-"+need.Suffix())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// run fails unless every order is handled.
	if err := run(ctx, client, queueURL); err != nil {
		t.Fatalf("run: %v", err)
	}
}
