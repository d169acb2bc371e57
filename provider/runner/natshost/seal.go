package natshost

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// ClusterKey is the secret every replica of a platform holds and nothing
// else does: it seals (encrypts and authenticates) every message between
// replicas and every presence entry. It never prints: %v, %s, %x, %#v,
// JSON and slog show "[redacted]".
type ClusterKey []byte

// MinKeyBytes is the shortest cluster key New accepts.
const MinKeyBytes = 32

func (ClusterKey) String() string               { return "[redacted]" }
func (ClusterKey) GoString() string             { return "natshost.ClusterKey([redacted])" }
func (ClusterKey) Format(f fmt.State, _ rune)   { _, _ = f.Write([]byte("[redacted]")) }
func (ClusterKey) LogValue() slog.Value         { return slog.StringValue("[redacted]") }
func (ClusterKey) MarshalJSON() ([]byte, error) { return []byte(`"[redacted]"`), nil }
func (ClusterKey) MarshalText() ([]byte, error) { return []byte("[redacted]"), nil }

// ParseKey reads a cluster key written as text: base64 (standard or URL
// alphabet, padded or not) or hex, of at least MinKeyBytes bytes once
// decoded; surrounding white space is ignored. `openssl rand -base64 48`
// makes one.
func ParseKey(text string) (ClusterKey, error) {
	s := strings.TrimSpace(text)
	var b []byte
	var err error
	if b, err = hex.DecodeString(s); err != nil {
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
			if b, err = enc.DecodeString(s); err == nil {
				break
			}
		}
	}
	if err != nil {
		return nil, errors.New("natshost: the cluster key is neither base64 nor hex text")
	}
	if len(b) < MinKeyBytes {
		return nil, fmt.Errorf("natshost: the cluster key is %d bytes, want at least %d (openssl rand -base64 48)", len(b), MinKeyBytes)
	}
	return ClusterKey(b), nil
}

// ReadKeyFile reads a cluster key from a file (ParseKey's text) that no
// other user may read or write: a key file open to group or others is
// refused.
func ReadKeyFile(path string) (ClusterKey, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("natshost: cluster key file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("natshost: cluster key file %s is mode %v: group and others must have no access (chmod 600)", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("natshost: cluster key file: %w", err)
	}
	return ParseKey(string(b))
}

// A sealed message (the data of every NATS message between replicas, and
// every presence entry) is
//
//	version(1) class(1) session(16) counter(8) unix-nanos(8) | AES-256-GCM(inner) tag(16)
//
// where the AES key is derived (HKDF-SHA256) from the cluster key and the
// sending replica's session (16 random bytes drawn at New), and the nonce
// is the class and the session's counter for that class, so no nonce
// repeats under one key. The additional data is the envelope's head, the
// message's subject and reply subject (a presence entry: the bucket and
// key), so that a sealed message moved to another subject, given another
// reply subject, or put into the bucket does not open. inner is the
// message's headers and data. Classes:
//
//   - classRequest: a call, a ping, an unsubscribe, a deletion, a
//     stream's keep-alive. It opens at most once per receiving replica:
//     the receiver keeps, per sending session, a window of the last
//     replayWindow counters it opened, and refuses a counter seen, or one
//     older than the window, or a message stamped further than maxSkew
//     from its clock.
//   - classAnswer: a call's answer, a ping's, a stream's numbered
//     frames. Each goes to a subject that is used once (a call's or a
//     ping's response token, a stream's inbox, whose frames are numbered
//     from 1 and a gap or a repeat ends the stream), so a replay finds
//     nobody or a broken sequence; the clock check applies too.
//   - classPresence: a presence entry; its staleness is its Stamp's.
const (
	sealVersion   = 1
	classRequest  = 'R'
	classAnswer   = 'A'
	classPresence = 'P'

	sessionLen = 16
	headLen    = 2 + sessionLen + 8 + 8
	sealOver   = headLen + 16 // what sealing adds to a message

	maxSkew      = time.Minute
	replayWindow = 1 << 16 // counters of classRequest remembered per session
	maxSessions  = 4096    // sending sessions remembered
)

var errUnsealed = errors.New("natshost: a message not sealed with the cluster key (or replayed, or stale)")

// sealer seals this replica's messages and opens other replicas'.
type sealer struct {
	master  ClusterKey
	session [sessionLen]byte
	aead    cipher.AEAD
	ctr     [256]atomic.Uint64 // by class
	names   []byte             // the key of presence keys (keyOf)

	mu    sync.Mutex
	peers map[[sessionLen]byte]*peer
}

// peer is what a replica knows of another's sending session.
type peer struct {
	aead cipher.AEAD
	last time.Time // when a message of it last opened

	mu      sync.Mutex
	highest uint64 // the highest classRequest counter opened
	seen    [replayWindow / 64]uint64
}

func newSealer(key ClusterKey) (*sealer, error) {
	if len(key) < MinKeyBytes {
		return nil, fmt.Errorf("natshost: Config.ClusterKey is %d bytes, want at least %d: every replica must hold the same secret key (openssl rand -base64 48)", len(key), MinKeyBytes)
	}
	s := &sealer{master: append(ClusterKey(nil), key...), peers: map[[sessionLen]byte]*peer{}}
	if _, err := rand.Read(s.session[:]); err != nil {
		return nil, err
	}
	var err error
	if s.aead, err = s.derive(s.session); err != nil {
		return nil, err
	}
	if s.names, err = hkdf.Key(sha256.New, s.master, nil, "managoat natshost v1 presence keys", 32); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *sealer) derive(session [sessionLen]byte) (cipher.AEAD, error) {
	k, err := hkdf.Key(sha256.New, s.master, session[:], "managoat natshost v1 seal", 32)
	if err != nil {
		return nil, err
	}
	b, err := aes.NewCipher(k)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}

// keyOf is runner id's presence key: a keyed hash, so that the bucket's
// keys tell a NATS user nothing of the runners' ids.
func (s *sealer) keyOf(id string) string {
	m := hmac.New(sha256.New, s.names)
	m.Write([]byte(id))
	return "r_" + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// aad is the additional data of a sealed message: its head, then its
// subject and reply subject, each with its length.
func aad(dst, head []byte, subject, reply string) []byte {
	dst = append(dst, head...)
	dst = binary.AppendUvarint(dst, uint64(len(subject)))
	dst = append(dst, subject...)
	dst = binary.AppendUvarint(dst, uint64(len(reply)))
	return append(dst, reply...)
}

// appendHeader appends hdr, encoded as inner headers, to dst.
func appendHeader(dst []byte, hdr nats.Header) []byte {
	n := 0
	for _, vs := range hdr {
		n += len(vs)
	}
	dst = binary.AppendUvarint(dst, uint64(n))
	for k, vs := range hdr {
		for _, v := range vs {
			dst = binary.AppendUvarint(dst, uint64(len(k)))
			dst = append(dst, k...)
			dst = binary.AppendUvarint(dst, uint64(len(v)))
			dst = append(dst, v...)
		}
	}
	return dst
}

// seal is the sealed message of hdr and data for subject and reply.
func (s *sealer) seal(class byte, subject, reply string, hdr nats.Header, data []byte) []byte {
	return s.sealAt(time.Now(), class, subject, reply, hdr, data)
}

// sealAt is seal stamped at now.
func (s *sealer) sealAt(now time.Time, class byte, subject, reply string, hdr nats.Header, data []byte) []byte {
	inner := appendHeader(nil, hdr)
	out := make([]byte, headLen, headLen+len(inner)+len(data)+16)
	out[0], out[1] = sealVersion, class
	copy(out[2:], s.session[:])
	ctr := s.ctr[class].Add(1)
	binary.BigEndian.PutUint64(out[2+sessionLen:], ctr)
	binary.BigEndian.PutUint64(out[2+sessionLen+8:], uint64(now.UnixNano()))
	var nonce [12]byte
	nonce[0] = class
	binary.BigEndian.PutUint64(nonce[4:], ctr)
	plain := append(append(out[headLen:], inner...), data...)
	ad := aad(make([]byte, 0, headLen+len(subject)+len(reply)+20), out[:headLen], subject, reply)
	return s.aead.Seal(out[:headLen], nonce[:], plain, ad)
}

// open checks and opens a sealed message of one of classes, received on
// subject with reply: its headers and data. The message's buffer is
// reused.
func (s *sealer) open(msg []byte, subject, reply string, classes ...byte) (nats.Header, []byte, byte, error) {
	if len(msg) < sealOver || msg[0] != sealVersion {
		return nil, nil, 0, errUnsealed
	}
	class := msg[1]
	ok := false
	for _, c := range classes {
		ok = ok || c == class
	}
	if !ok {
		return nil, nil, 0, errUnsealed
	}
	var session [sessionLen]byte
	copy(session[:], msg[2:])
	ctr := binary.BigEndian.Uint64(msg[2+sessionLen:])
	stamp := time.Unix(0, int64(binary.BigEndian.Uint64(msg[2+sessionLen+8:])))
	if class != classPresence {
		if d := time.Since(stamp); d > maxSkew || d < -maxSkew {
			return nil, nil, 0, errUnsealed
		}
	}
	p, err := s.peer(session)
	if err != nil {
		return nil, nil, 0, err
	}
	var nonce [12]byte
	nonce[0] = class
	binary.BigEndian.PutUint64(nonce[4:], ctr)
	ad := aad(make([]byte, 0, headLen+len(subject)+len(reply)+20), msg[:headLen], subject, reply)
	plain, err := p.aead.Open(msg[headLen:headLen], nonce[:], msg[headLen:], ad)
	if err != nil {
		return nil, nil, 0, errUnsealed
	}
	p = s.admit(session, p)
	if class == classRequest && !p.fresh(ctr) {
		return nil, nil, 0, errUnsealed
	}
	hdr, data, err := splitHeader(plain)
	if err != nil {
		return nil, nil, 0, errUnsealed // sealed by a replica, so not expected
	}
	return hdr, data, class, nil
}

// peer is the state of a sending session, made (not yet remembered: a
// forged message must not take a place) when unknown.
func (s *sealer) peer(session [sessionLen]byte) (*peer, error) {
	s.mu.Lock()
	p := s.peers[session]
	s.mu.Unlock()
	if p != nil {
		return p, nil
	}
	a, err := s.derive(session)
	if err != nil {
		return nil, err
	}
	return &peer{aead: a}, nil
}

// admit remembers p, whose message opened, and returns the session's
// remembered state (p, or the one remembered meanwhile). Past
// maxSessions, sessions silent for longer than 2×maxSkew are forgotten
// (their messages are refused as stale from then on); if none is, the
// oldest is.
func (s *sealer) admit(session [sessionLen]byte, p *peer) *peer {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if q := s.peers[session]; q != nil {
		q.last = now
		return q
	}
	if len(s.peers) >= maxSessions {
		var oldest [sessionLen]byte
		var at time.Time
		for k, q := range s.peers {
			if now.Sub(q.last) > 2*maxSkew {
				delete(s.peers, k)
			} else if at.IsZero() || q.last.Before(at) {
				oldest, at = k, q.last
			}
		}
		if len(s.peers) >= maxSessions {
			delete(s.peers, oldest)
		}
	}
	p.last = now
	s.peers[session] = p
	return p
}

// fresh reports whether classRequest counter ctr of p opens for the first
// time, and marks it seen.
func (p *peer) fresh(ctr uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ctr > p.highest {
		shift := ctr - p.highest
		if shift >= replayWindow {
			clear(p.seen[:])
		} else {
			for i := p.highest + 1; i <= ctr; i++ {
				p.seen[(i%replayWindow)/64] &^= 1 << (i % 64)
			}
		}
		p.highest = ctr
	} else if p.highest-ctr >= replayWindow {
		return false
	}
	w, b := (ctr%replayWindow)/64, ctr%64
	if p.seen[w]&(1<<b) != 0 {
		return false
	}
	p.seen[w] |= 1 << b
	return true
}

// splitHeader is appendHeader's inverse, and the data after it.
func splitHeader(b []byte) (nats.Header, []byte, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) {
		return nil, nil, errUnsealed
	}
	b = b[k:]
	var hdr nats.Header
	if n > 0 {
		hdr = make(nats.Header, n)
	}
	next := func() (string, bool) {
		l, k := binary.Uvarint(b)
		if k <= 0 || l > uint64(len(b)-k) {
			return "", false
		}
		s := string(b[k : k+int(l)])
		b = b[k+int(l):]
		return s, true
	}
	for range n {
		key, ok1 := next()
		val, ok2 := next()
		if !ok1 || !ok2 {
			return nil, nil, errUnsealed
		}
		hdr[key] = append(hdr[key], val)
	}
	return hdr, b, nil
}
