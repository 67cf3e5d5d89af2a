#!/bin/sh
# Prints the URLs and environment for the services in docker-compose.yml;
# use as: eval "$(localstack/env.sh)"
cat <<'ENV'
export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1
export FAUXQS_ENDPOINT=http://127.0.0.1:4566
export PUBSUB_EMULATOR_HOST=127.0.0.1:8085
export SERVICEBUS_CONNECTION_STRING='Endpoint=sb://localhost;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;'
export DEDUPQ_URL_SQS='sqs://orders.fifo?region=us-east-1&endpoint=http://127.0.0.1:4566&create=true'
export DEDUPQ_URL_JETSTREAM='jetstream://127.0.0.1:4222/ORDERS?subject=orders&durable=worker&create=true'
ENV
