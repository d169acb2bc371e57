package journal_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/managoat/managoat/provider/local/journal"
)

// A writer appends output and the exit status; any number of readers
// replay it from byte zero.
func Example() {
	dir, _ := os.MkdirTemp("", "journal-example-")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "journal")

	w, _ := journal.Create(path)
	w.Append(journal.KindStdout, []byte("ready\n"))
	w.Append(journal.KindStderr, []byte("warning\n"))
	size, _ := w.AppendExit(0, 0)
	w.Close()

	r, _ := journal.Open(path)
	defer r.Close()
	r.Read(size, func(rec journal.Record) error {
		switch rec.Kind {
		case journal.KindExit:
			fmt.Printf("@%d exit %d\n", rec.Offset, rec.Code)
		default:
			fmt.Printf("@%d %s %q\n", rec.Offset, rec.Kind, rec.Data)
		}
		return nil
	})
	// Output:
	// @0 stdout "ready\n"
	// @11 stderr "warning\n"
	// @24 exit 0
}
