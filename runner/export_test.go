package runner

// SetMaxJournal sets the per-session journal bound for a test and returns
// the function that restores it.
func SetMaxJournal(n int) (restore func()) {
	old := maxJournal
	maxJournal = n
	return func() { maxJournal = old }
}

// JournalBytes is the output the daemon holds in memory for the sessions
// of sandbox name, and whether any of them was trimmed.
func (d *Daemon) JournalBytes(name string) (n int, trimmed bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, s := range d.sessions {
		if s.name != name {
			continue
		}
		s.mu.Lock()
		for _, ev := range s.journal {
			n += len(ev.Data)
		}
		trimmed = trimmed || s.trimmed
		s.mu.Unlock()
	}
	return n, trimmed
}
