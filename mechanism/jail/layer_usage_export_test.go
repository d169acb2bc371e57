package jail

// NoOverlay makes this process's jails take the host for one without
// overlayfs (image sandboxes on a copy of their image) until t ends.
// Not for parallel tests.
func NoOverlay(t interface{ Cleanup(func()) }) {
	old := overlayOnce
	overlayOnce = func() bool { return false }
	t.Cleanup(func() { overlayOnce = old })
}
