#!/bin/sh
# Runs inside LocalStack once SQS is ready: a FIFO queue with a dead-letter
# queue, so the redelivery span dedupq reads is bounded (5 receives × 30s).
# The same queues as an sqs:// URL with create=true makes (adapters/sqs).
set -e
awslocal sqs create-queue --queue-name orders-dlq.fifo --attributes FifoQueue=true
dlq_arn=$(awslocal sqs get-queue-attributes --queue-url http://localhost:4566/000000000000/orders-dlq.fifo \
  --attribute-names QueueArn --query Attributes.QueueArn --output text)
awslocal sqs create-queue --queue-name orders.fifo --attributes "{\"FifoQueue\":\"true\",\"VisibilityTimeout\":\"30\",\"RedrivePolicy\":\"{\\\"deadLetterTargetArn\\\":\\\"$dlq_arn\\\",\\\"maxReceiveCount\\\":\\\"5\\\"}\"}"
