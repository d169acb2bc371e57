package natshost

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/nats-io/nats.go"
)

// A relayed call or its answer can be larger than a NATS message may be
// (the server's max_payload, 1 MB by default): a file write carries up to
// wire.MaxWriteFile, an exec's answer up to wire.MaxExecOutput. Such a
// message is sent as numbered parts on the same subject, each with the
// headers below, and put back together by the receiver, which holds at
// most maxAssembling bytes of unfinished messages (their data, and a slot
// per announced part) and forgets a message whose parts stop coming for
// partTimeout.
const (
	hdrMsg  = "Managoat-Msg"  // the message's id, shared by its parts
	hdrPart = "Managoat-Part" // "i/n", 1-based
)

const (
	maxAssembling = 128 << 20
	partTimeout   = 30 * time.Second
)

// publish seals hdr and data (a message of class, for subject and reply)
// and sends it on subject (with reply, if set), in parts when it is
// larger than the connection's maximum payload allows. The parts carry
// only hdrMsg and hdrPart in the clear; the receiver opens the message
// once it has every part.
func (h *Host) publish(subject, reply string, class byte, hdr nats.Header, data []byte) error {
	data = h.seal.seal(class, subject, reply, hdr, data)
	limit := int(h.nc.MaxPayload()) - 1024 // room for the headers
	if limit < 1024 {
		limit = 1024
	}
	if len(data) <= limit {
		return h.nc.PublishMsg(&nats.Msg{Subject: subject, Reply: reply, Data: data})
	}
	n := (len(data) + limit - 1) / limit
	id := nats.NewInbox()[len(nats.InboxPrefix):]
	for i := 0; i < n; i++ {
		part := data[i*limit : min(len(data), (i+1)*limit)]
		m := &nats.Msg{Subject: subject, Reply: reply, Data: part, Header: nats.Header{}}
		m.Header.Set(hdrMsg, id)
		m.Header.Set(hdrPart, fmt.Sprintf("%d/%d", i+1, n))
		if err := h.nc.PublishMsg(m); err != nil {
			return err
		}
	}
	return nil
}

// assembler puts parted messages back together.
type assembler struct {
	mu    sync.Mutex
	held  int
	parts map[string]*partial
}

type partial struct {
	got   [][]byte
	n     int
	size  int // bytes held: its data and its slots
	begun time.Time
}

// slotSize is the memory of one part's slot in a partial.
const slotSize = int(unsafe.Sizeof([]byte(nil)))

var errTooLarge = errors.New("natshost: parted messages in flight exceed the bound")

// add takes one message; it returns the whole message's data once its
// last part arrived (a message that is not parted is whole at once).
func (a *assembler) add(m *nats.Msg) (data []byte, whole bool, err error) {
	id := m.Header.Get(hdrMsg)
	if id == "" {
		return m.Data, true, nil
	}
	i, n, ok := parsePart(m.Header.Get(hdrPart))
	if !ok {
		return nil, false, fmt.Errorf("natshost: bad part header %q", m.Header.Get(hdrPart))
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.parts == nil {
		a.parts = map[string]*partial{}
	}
	now := time.Now()
	for k, p := range a.parts {
		if now.Sub(p.begun) > partTimeout {
			a.held -= p.size
			delete(a.parts, k)
		}
	}
	p := a.parts[id]
	if p == nil {
		// Its slots count toward the bound as its data does: a first
		// part announcing 65,536 parts holds 1.5 MB before any data.
		slots := n * slotSize
		if a.held+slots > maxAssembling {
			return nil, false, errTooLarge
		}
		p = &partial{got: make([][]byte, n), n: n, begun: now, size: slots}
		a.held += slots
		a.parts[id] = p
	}
	if p.n != n || p.got[i-1] != nil {
		return nil, false, fmt.Errorf("natshost: inconsistent part %d/%d", i, n)
	}
	if a.held+len(m.Data) > maxAssembling {
		a.held -= p.size
		delete(a.parts, id)
		return nil, false, errTooLarge
	}
	p.got[i-1] = m.Data
	p.size += len(m.Data)
	a.held += len(m.Data)
	for _, g := range p.got {
		if g == nil {
			return nil, false, nil
		}
	}
	a.held -= p.size
	delete(a.parts, id)
	out := make([]byte, 0, p.size-n*slotSize)
	for _, g := range p.got {
		out = append(out, g...)
	}
	return out, true, nil
}

func parsePart(s string) (i, n int, ok bool) {
	a, b, found := strings.Cut(s, "/")
	if !found {
		return 0, 0, false
	}
	i, err1 := strconv.Atoi(a)
	n, err2 := strconv.Atoi(b)
	if err1 != nil || err2 != nil || n < 1 || n > 1<<16 || i < 1 || i > n {
		return 0, 0, false
	}
	return i, n, true
}
