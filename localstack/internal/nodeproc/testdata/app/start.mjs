// Prints the ready line from the installed package, then runs until its
// standard input closes, like the real emulators.
import { ready } from "greeting";
console.log(ready);
process.stdin.resume();
process.stdin.on("end", () => process.exit(0));
