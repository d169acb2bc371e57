package natshost

import (
	"errors"
	"fmt"
	"testing"
	"unsafe"

	"github.com/nats-io/nats.go"
)

// TestPartHeadersCountInTheBound: a parted message's first part announces
// how many parts follow, and the receiver keeps a slot for each; the slots
// count toward the bound (maxAssembling) as the data does. Empty first
// parts of 65,536-part messages (anyone who can publish on the subject)
// held 1.5 MB each outside the bound, without limit for partTimeout.
func TestPartHeadersCountInTheBound(t *testing.T) {
	const n, msgs = 1 << 16, 90 // 90 × 1.5 MB of slots: past the 128 MiB bound
	var a assembler
	accepted := 0
	for i := range msgs {
		m := &nats.Msg{Header: nats.Header{hdrMsg: []string{fmt.Sprint("m", i)}, hdrPart: []string{fmt.Sprintf("1/%d", n)}}}
		_, whole, err := a.add(m)
		switch {
		case errors.Is(err, errTooLarge):
		case err != nil || whole:
			t.Fatalf("part 1 of message %d: %v, whole %v", i, err, whole)
		default:
			accepted++
		}
	}
	slots := accepted * n * int(unsafe.Sizeof([]byte(nil)))
	if slots > maxAssembling || a.held > maxAssembling {
		t.Fatalf("%d messages' first parts held (%d MiB of slots; counted %d MiB), bound %d MiB", accepted, slots>>20, a.held>>20, maxAssembling>>20)
	}
	if accepted == 0 {
		t.Fatal("no message accepted")
	}
}
