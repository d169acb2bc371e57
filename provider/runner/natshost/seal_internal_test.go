package natshost

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

func testSealer(t *testing.T, key ClusterKey) *sealer {
	t.Helper()
	s, err := newSealer(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSealRefusesTampering: a sealed message opens, with its headers and
// data, only as it was sealed: not with a bit flipped anywhere, not on
// another subject or with another reply subject, not as another class,
// not under another cluster key, not stamped beyond the clock skew; a
// request opens once per receiver (a replay is refused), and a request
// older than the replay window is refused.
func TestSealRefusesTampering(t *testing.T) {
	key := ClusterKey(bytes.Repeat([]byte{7}, 32))
	a, b := testSealer(t, key), testSealer(t, key)
	hdr := nats.Header{"Managoat-Runner": {"r1"}, "Managoat-Account": {"acme"}}
	msg := a.seal(classRequest, "managoat.runners.call.b", "_INBOX.x.1", hdr, []byte("exec"))
	cp := func() []byte { return append([]byte(nil), msg...) }

	for i := range msg {
		m := cp()
		m[i] ^= 1
		if _, _, _, err := b.open(m, "managoat.runners.call.b", "_INBOX.x.1", classRequest); err == nil {
			t.Fatalf("a bit flipped at %d/%d: opened", i, len(msg))
		}
	}
	for _, c := range []struct{ subject, reply string }{
		{"managoat.runners.call.c", "_INBOX.x.1"}, {"managoat.runners.call.b", "_INBOX.evil.1"}, {"managoat.runners.call.b", ""},
	} {
		if _, _, _, err := b.open(cp(), c.subject, c.reply, classRequest); err == nil {
			t.Fatalf("opened on %q reply %q", c.subject, c.reply)
		}
	}
	if _, _, _, err := b.open(cp(), "managoat.runners.call.b", "_INBOX.x.1", classAnswer); err == nil {
		t.Fatal("a request opened as an answer")
	}
	other := testSealer(t, ClusterKey(bytes.Repeat([]byte{8}, 32)))
	if _, _, _, err := other.open(cp(), "managoat.runners.call.b", "_INBOX.x.1", classRequest); err == nil {
		t.Fatal("opened under another cluster key")
	}
	h, data, _, err := b.open(cp(), "managoat.runners.call.b", "_INBOX.x.1", classRequest)
	if err != nil || string(data) != "exec" || h.Get("Managoat-Runner") != "r1" || h.Get("Managoat-Account") != "acme" {
		t.Fatalf("the message as sealed: %v %q %v", h, data, err)
	}
	if _, _, _, err := b.open(cp(), "managoat.runners.call.b", "_INBOX.x.1", classRequest); err == nil {
		t.Fatal("a request replayed: opened twice")
	}
	// Another receiver opens it once too.
	if _, _, _, err := testSealer(t, key).open(cp(), "managoat.runners.call.b", "_INBOX.x.1", classRequest); err != nil {
		t.Fatalf("another replica: %v", err)
	}

	// Answers are not counted: two of them open (their subjects are used once).
	ans := a.seal(classAnswer, "_INBOX.x.1", "", nil, []byte("ok"))
	for range 2 {
		if _, _, _, err := b.open(append([]byte(nil), ans...), "_INBOX.x.1", "", classAnswer); err != nil {
			t.Fatal(err)
		}
	}

	// Stale, and ahead of the clock.
	for _, d := range []time.Duration{-2 * maxSkew, 2 * maxSkew} {
		for _, class := range []byte{classAnswer, classRequest} {
			if _, _, _, err := b.open(a.sealAt(time.Now().Add(d), class, "s", "", nil, nil), "s", "", class); err == nil {
				t.Fatalf("a message stamped %v away opened", d)
			}
		}
	}
	if _, _, _, err := b.open(a.sealAt(time.Now().Add(-maxSkew/2), classAnswer, "s", "", nil, nil), "s", "", classAnswer); err != nil {
		t.Fatalf("a message stamped within the skew: %v", err)
	}

	// The window: a request older than replayWindow counters is refused,
	// one within it opens once, out of order.
	var old [][]byte
	for range 3 {
		old = append(old, a.seal(classRequest, "s", "", nil, nil))
	}
	for range replayWindow {
		a.ctr[classRequest].Add(1)
	}
	late := a.seal(classRequest, "s", "", nil, nil)
	if _, _, _, err := b.open(late, "s", "", classRequest); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := b.open(old[0], "s", "", classRequest); err == nil {
		t.Fatal("a request older than the window opened")
	}
	recent := []*[]byte{}
	for range 3 {
		m := a.seal(classRequest, "s", "", nil, nil)
		recent = append(recent, &m)
	}
	for _, i := range []int{2, 0, 1} {
		m := append([]byte(nil), (*recent[i])...)
		if _, _, _, err := b.open(m, "s", "", classRequest); err != nil {
			t.Fatalf("request %d out of order: %v", i, err)
		}
		if _, _, _, err := b.open(*recent[i], "s", "", classRequest); err == nil {
			t.Fatalf("request %d replayed out of order: opened", i)
		}
	}
}

// TestPresenceKeysHideIDs: a presence key is a keyed hash: it does not
// hold the runner id (nor its base64), and another cluster key makes
// another.
func TestPresenceKeysHideIDs(t *testing.T) {
	a := testSealer(t, ClusterKey(bytes.Repeat([]byte{1}, 32)))
	b := testSealer(t, ClusterKey(bytes.Repeat([]byte{2}, 32)))
	id := "be33e939-8ea8-86c4-997f-184184c3d693"
	k := a.keyOf(id)
	if strings.Contains(k, base64.RawURLEncoding.EncodeToString([]byte(id))[:12]) || strings.Contains(k, id) || k == b.keyOf(id) || k != a.keyOf(id) {
		t.Fatalf("presence key %q of %q", k, id)
	}
}

// TestClusterKeyNeverPrints: the key does not show in any format, in
// JSON, in slog, or in a Config printed whole.
func TestClusterKeyNeverPrints(t *testing.T) {
	secret := "c2VjcmV0LWNsdXN0ZXIta2V5LWJ5dGVzLWZvci10aGUtdGVzdC0xMjM0NTY3OA"
	k, err := ParseKey(secret)
	if err != nil {
		t.Fatal(err)
	}
	raw := string(k)
	js, _ := json.Marshal(struct{ K ClusterKey }{k})
	var logged bytes.Buffer
	slog.New(slog.NewTextHandler(&logged, nil)).Info("x", "key", k)
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("x", "key", k)
	out := fmt.Sprintf("%v %s %x %X %q %#v %+v %d", k, k, k, k, k, k, Config{ClusterKey: k}, k) + string(js) + logged.String()
	for _, leak := range []string{raw, secret, fmt.Sprintf("%x", []byte(raw)), base64.StdEncoding.EncodeToString([]byte(raw))[:16]} {
		if strings.Contains(out, leak) {
			t.Fatalf("the key shows: %s", out)
		}
	}
	if _, err := ParseKey("c2hvcnQ"); err == nil {
		t.Fatal("a short key was taken")
	}
	if _, err := newSealer(ClusterKey("short")); err == nil {
		t.Fatal("New would take a short key")
	}
}
