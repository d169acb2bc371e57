package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Binary stream frames (an extension). A daemon that can send stdout and
// stderr as binary WebSocket frames reports CapBinaryStream in the
// handshake's caps; a platform that takes them answers the upgrade (101)
// with the header HeaderAccept listing CapBinaryStream. Only then does the
// daemon send output as binary frames, and only then does the platform
// accept a binary frame: a platform that never answers the header
// (Fountain's) gets base64 text frames, and a daemon that never reports the
// cap (Fountain's) is answered without the header and closed with 1003 on
// a binary frame, as before. Exit and error frames stay JSON text.
//
// Layout of a binary stream frame (big-endian), BinaryHeader + len(session id)
// + len(data) bytes, at most MaxBinaryFrame:
//
//	offset  size  field
//	0       1     kind: 1 stdout, 2 stderr (BinaryStdout, BinaryStderr)
//	1       1     session id length L, 1..MaxBinarySessionID
//	2       8     replay_for, as the text frame's (0: live); < 2^63
//	10      L     session id, UTF-8 without control characters
//	10+L    rest  the output's raw bytes, 1..MaxChunk
//
// Any other frame (short, unknown kind, empty or oversized session id or
// data, replay_for with the top bit set) is malformed: the platform closes
// the socket with CloseBadFrame (1007), or CloseTooBig (1009) for a frame
// over MaxBinaryFrame, which it stops reading at that bound.
const CapBinaryStream = "binary_stream"

// HeaderAccept is the upgrade response's header in which a platform lists
// (comma-separated) the extensions of the daemon's caps it takes in the
// daemon's direction; today only CapBinaryStream.
const HeaderAccept = "X-Managoat-Runner-Accept"

// Binary stream frame kinds.
const (
	BinaryStdout = 1
	BinaryStderr = 2
)

// BinaryHeader is the fixed part of a binary stream frame.
const BinaryHeader = 10

// MaxBinarySessionID is the longest session id a binary frame carries
// (a longer one goes as a text frame).
const MaxBinarySessionID = 255

// MaxBinaryFrame is the largest binary stream frame.
const MaxBinaryFrame = BinaryHeader + MaxBinarySessionID + MaxChunk

// Close codes of binary frames.
const (
	CloseBadFrame = 1007 // a malformed binary stream frame
	CloseTooBig   = 1009 // a binary frame over MaxBinaryFrame
)

// ErrNotBinary is AppendBinaryStream's answer for a frame that has no
// binary form (exit, error, an empty chunk or a session id too long).
var ErrNotBinary = errors.New("wire: frame has no binary form")

// AppendBinaryStream appends s as a binary stream frame.
func AppendBinaryStream(dst []byte, s *Stream) ([]byte, error) {
	var k byte
	switch s.Kind {
	case StreamStdout:
		k = BinaryStdout
	case StreamStderr:
		k = BinaryStderr
	default:
		return dst, ErrNotBinary
	}
	if n := len(s.SessionID); n == 0 || n > MaxBinarySessionID || len(s.Data) == 0 || len(s.Data) > MaxChunk || s.ReplayFor < 0 {
		return dst, ErrNotBinary
	}
	dst = append(dst, k, byte(len(s.SessionID)))
	dst = binary.BigEndian.AppendUint64(dst, uint64(s.ReplayFor))
	dst = append(dst, s.SessionID...)
	return append(dst, s.Data...), nil
}

// DecodeBinaryStream parses a binary stream frame. The Stream's Data
// aliases b. The error says what is wrong, for the close reason.
func DecodeBinaryStream(b []byte) (*Stream, error) {
	if len(b) > MaxBinaryFrame {
		return nil, fmt.Errorf("binary frame of %d bytes, over %d", len(b), MaxBinaryFrame)
	}
	if len(b) < BinaryHeader {
		return nil, fmt.Errorf("binary frame of %d bytes, under its %d-byte header", len(b), BinaryHeader)
	}
	s := &Stream{}
	switch b[0] {
	case BinaryStdout:
		s.Kind = StreamStdout
	case BinaryStderr:
		s.Kind = StreamStderr
	default:
		return nil, fmt.Errorf("binary frame of unknown kind %d", b[0])
	}
	l := int(b[1])
	r := binary.BigEndian.Uint64(b[2:10])
	if r>>63 != 0 {
		return nil, errors.New("binary frame's replay_for is negative")
	}
	if l == 0 || BinaryHeader+l > len(b) {
		return nil, fmt.Errorf("binary frame's session id length %d does not fit", l)
	}
	sid := b[BinaryHeader : BinaryHeader+l]
	if !utf8.Valid(sid) || strings.ContainsFunc(string(sid), func(c rune) bool { return c < 0x20 || c == 0x7f }) {
		return nil, errors.New("binary frame's session id is not printable UTF-8")
	}
	data := b[BinaryHeader+l:]
	if len(data) == 0 || len(data) > MaxChunk {
		return nil, fmt.Errorf("binary frame carries %d bytes of output, not 1..%d", len(data), MaxChunk)
	}
	s.SessionID, s.ReplayFor, s.Data = string(sid), int64(r), data
	return s, nil
}
