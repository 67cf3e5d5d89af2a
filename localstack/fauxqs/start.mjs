// Starts fauxqs (an SQS emulator) for dedupq's adapters/sqs tests.
//
// It listens on FAUXQS_PORT (0, the default here, picks a free port), prints
// one line "fauxqs listening on port N" once it accepts connections, and
// stops when its standard input closes, so that a test process that dies
// without cleaning up cannot leave an emulator running.
import { startFauxqs } from "fauxqs";

const port = Number.parseInt(process.env.FAUXQS_PORT ?? "0", 10);
const server = await startFauxqs({ port, logger: false });
process.stdout.write(`fauxqs listening on port ${server.port}\n`);

let stopping = false;
async function stop() {
  if (stopping) return;
  stopping = true;
  try {
    await server.stop();
  } finally {
    process.exit(0);
  }
}
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
process.stdin.on("end", stop);
process.stdin.on("error", stop);
process.stdin.resume();
