package outbox

// SetHook makes r call f at each step of a batch ("claimed", "published",
// "marked"): the crash tests kill the process there.
func SetHook(r *Relay, f func(step string)) { r.hook = f }
