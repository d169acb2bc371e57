package jail

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// SimulateNoIdmap makes the idmapped-layer probe answer "no" for the file
// system of dir until t ends.
func SimulateNoIdmap(t *testing.T, dir string) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	old, had := idmapProbes.Load(st.Dev)
	idmapProbes.Store(st.Dev, error(errors.New("simulated: no overlay on an idmapped layer")))
	t.Cleanup(func() {
		if had {
			idmapProbes.Store(st.Dev, old)
		} else {
			idmapProbes.Delete(st.Dev)
		}
	})
}

// SimulateNoHolder makes every user namespace made ahead of an init fail
// until t ends (as where ptrace is refused).
func SimulateNoHolder(t *testing.T) {
	old := makeUserns
	makeUserns = func(int) (int, error) { return -1, errors.New("simulated: no holder") }
	t.Cleanup(func() { makeUserns = old })
}
