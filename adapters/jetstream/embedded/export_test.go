package embedded

// State reports the server jetstream://embedded/… URLs name: how many
// servers were started in this process, whether one runs, and its store
// directory ("" when none was made or Shutdown removed it).
func State() (starts int, running bool, dir string) {
	shared.lock <- struct{}{}
	defer func() { <-shared.lock }()
	return shared.starts, shared.srv != nil, shared.dir
}
