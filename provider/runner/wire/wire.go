// Package wire is the runner protocol shared by both ends: the platform
// (provider/runner) and the daemon (runner). One WebSocket per daemon, dialled
// outbound by the daemon; every application frame is a text frame holding one
// JSON object, but for the binary stream frames of the extension below.
//
//   - Requests (platform → daemon) carry an integer id (≥ 1, or 0 for a
//     fire-and-forget detach) and an op, one of the 14 in Ops.
//   - Replies (daemon → platform) echo the id with ok:true and a result
//     object, or ok:false with an error code and a detail string.
//   - Stream frames (daemon → platform, unsolicited) carry stream
//     ("stdout", "stderr" or "exit"), session_id, base64 data (standard
//     alphabet, padded) or an exit code, and replay_for when the frame is
//     replayed from the session journal for one spawn or attach request.
//
// Output chunks are at most MaxChunk (32 KiB) of raw bytes per frame; a
// message may be at most ReadLimit (64 MiB).
//
// Decode is hand-written rather than encoding/json because it sits on the
// streaming hot path: it validates the whole frame as JSON (so a non-JSON
// text frame can be refused with 1003) but finds base64 payloads with a byte
// scan instead of a reflective decode. Its validity verdict is fuzzed against
// encoding/json's.
//
// Two extensions over Fountain's protocol are marked as such: a terminal
// "error" stream kind (a session whose upstream transport closed without an
// exit must surface as an error, never as exit 0), and the ops
// "network_policy" and "terminate_session", which a runner only receives when
// it advertised the matching capability in the handshake's caps parameter.
// Fountain's platform ignores unknown stream kinds and Fountain's daemon
// answers unknown ops not_supported, so both ends stay compatible. Likewise
// a list_sessions entry's "state" field (Session): Fountain's platform
// ignores it, and an entry of Fountain's daemon, without it, is read by
// its exit_code (Session.RunState).
//
// Binary stream frames (binary.go): a daemon that reports
// CapBinaryStream, on a platform that takes it in the upgrade's
// HeaderAccept, sends stdout and stderr as binary frames of a 10-byte
// header, the session id and the raw bytes, instead of base64 in JSON.
//
// Fleet extensions (capacity.go): the handshake's optional labels
// parameter (ParamLabels) and the op capacity (OpCapacity), sent only to
// a daemon that reported CapCapacity, whose reply is the host's Capacity.
// Fountain's platform ignores the parameter and never sends the op;
// Fountain's daemon sends neither and is placed by the platform's records.
package wire

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// Path is the daemon's endpoint on the platform, appended to the base URL.
const Path = "/api/runners/ws"

// MaxChunk is the most raw output bytes one stream frame carries.
const MaxChunk = 32 << 10

// ReadLimit is the largest message either end accepts.
const ReadLimit = 64 << 20

// SandboxTag is the tag a daemon puts after "--" on the wire id of every
// session of the sandbox called name: 16 hex digits of the SHA-256 of the
// name. A daemon numbers each sandbox's sessions on its own account (the
// local provider's are s1, s2, ... in every sandbox), and the platform
// routes stream frames by session id per connection: the tag keeps two
// sandboxes' sessions apart.
func SandboxTag(name string) string {
	sum := sha256.Sum256([]byte(name))
	return hex.EncodeToString(sum[:8])
}

// MaxWriteFile is the largest file one write_file carries: base64 makes
// it 48 MiB, with room under ReadLimit for the rest of the frame.
const MaxWriteFile = 36 << 20

// MaxExecOutput is the most output an exec reply carries (an extension:
// the reply then says "truncated": true). Base64 makes it 21⅓ MiB on the
// wire, a third of ReadLimit.
const MaxExecOutput = 16 << 20

// The 14 operations of the protocol.
const (
	OpCreate       = "create"
	OpGet          = "get"
	OpDestroy      = "destroy"
	OpList         = "list"
	OpSuspend      = "suspend"
	OpResume       = "resume"
	OpWriteFile    = "write_file"
	OpExec         = "exec"
	OpSpawn        = "spawn"
	OpStdin        = "stdin"
	OpStdinClose   = "stdin_close"
	OpDetach       = "detach"
	OpListSessions = "list_sessions"
	OpAttach       = "attach"
)

// Extension operations, sent only to a runner that advertised the matching
// capability (CapNetworkPolicy, CapTerminateSession) in its handshake.
const (
	OpNetworkPolicy    = "network_policy"
	OpTerminateSession = "terminate_session"
	// OpRunners is served only by the platform's proxy: the caller's online runners.
	OpRunners = "runners"
	// OpReadFile reads a file of the sandbox (Path); the reply's "data" is
	// its bytes in base64, at most MaxWriteFile of them. A runner that
	// predates it answers not_supported, as for any op it does not know.
	OpReadFile = "read_file"
	// OpSignal sends Signal (a Linux signal number) to session
	// SessionID's process group, as a CLI forwards its Ctrl-C; sent only
	// to a runner that reported CapSignal.
	OpSignal = "signal"
)

// Ops lists the 14 operations of the protocol, in the spec's order.
var Ops = []string{OpCreate, OpGet, OpDestroy, OpList, OpSuspend, OpResume, OpWriteFile,
	OpExec, OpSpawn, OpStdin, OpStdinClose, OpDetach, OpListSessions, OpAttach}

// Error codes of a failure reply. The first seven are Fountain's; the
// rest are extensions that name the remaining classes of the sandbox error
// taxonomy (Fountain's platform maps them to its provider escape hatch).
const (
	CodeNotFound      = "not_found"
	CodeCommandExited = "command_exited"
	CodeNotSupported  = "not_supported"
	CodeInvalid       = "invalid"
	CodeUnavailable   = "unavailable"
	CodeWriteFailed   = "write_failed"
	CodeProvider      = "provider"

	CodeAlreadyExists = "already_exists"
	CodeTruncated     = "truncated"
	CodeDenied        = "denied"
	CodeRateLimited   = "rate_limited"
	CodeRestoreFailed = "restore_failed"
	CodeUnsupported   = "unsupported"
)

// Stream kinds.
const (
	StreamStdout = "stdout"
	StreamStderr = "stderr"
	StreamExit   = "exit"
	// StreamError is an extension: the session's upstream transport closed
	// without an exit (or failed); carries error and detail like a reply.
	StreamError = "error"
)

// WebSocket close codes of the protocol.
const (
	CloseNormal      = 1000
	CloseGoingAway   = 1001
	CloseUnsupported = 1003 // a text frame that is not JSON, or a binary frame not negotiated (binary.go)
	CloseDeleted     = 4404 // the runner was deleted by the host
	CloseDuplicate   = 4409 // a runner of that name is already connected
)

// Query parameters of the handshake.
const (
	ParamName     = "name"
	ParamHostname = "hostname"
	ParamOS       = "os"
	ParamArch     = "arch"
	ParamVersion  = "version"
	ParamRoot     = "root"
	// ParamCaps is an extension: comma-separated sandbox capabilities the
	// runner's provider offers beyond suspend and attach.
	ParamCaps = "caps"
)

// Request is one platform → daemon frame. Optional fields are pointers so
// that JSON null and absence both decode to "unset".
type Request struct {
	ID             int64      `json:"id"`
	Op             string     `json:"op"`
	Name           string     `json:"name,omitempty"`
	Path           string     `json:"path,omitempty"`
	Data           *string    `json:"data,omitempty"` // base64, padded
	Mode           *int64     `json:"mode,omitempty"`
	Cmd            string     `json:"cmd,omitempty"`
	Args           []string   `json:"args,omitempty"`
	Env            [][]string `json:"env,omitempty"` // [key, value] pairs; others ignored
	Dir            *string    `json:"dir,omitempty"`
	TimeoutMS      *int64     `json:"timeout_ms,omitempty"`
	StderrToStdout bool       `json:"stderr_to_stdout,omitempty"`
	Stdin          bool       `json:"stdin,omitempty"`
	TTY            bool       `json:"tty,omitempty"`
	Detachable     bool       `json:"detachable,omitempty"`
	SessionID      string     `json:"session_id,omitempty"`

	// Extension fields.
	Allow  *[]string `json:"allow,omitempty"`  // network_policy: nil means unset; [] denies all
	Force  bool      `json:"force,omitempty"`  // terminate_session
	Signal int       `json:"signal,omitempty"` // signal, to a daemon with CapSignal
	Limits *Limits   `json:"limits,omitempty"` // create, to a daemon with CapLimits
	// attach, to a daemon with CapAttachOffset: the session's output
	// (stdout and stderr as one sequence) is sent from byte Offset on,
	// and OffsetCRC is the CRC-32C (Castagnoli) of the bytes before it.
	Offset    *int64 `json:"offset,omitempty"`
	OffsetCRC uint32 `json:"offset_crc,omitempty"`

	// Proxy extension (provider/runner's ProxyPath, never sent to a daemon):
	// the runner a name-less op (list) goes to.
	RunnerID string `json:"runner_id,omitempty"`

	// rawData is Data as its base64 text (SetRawData), put into Encode's
	// output as it is, without JSON encoding: a request relayed by another
	// replica (provider/runner/natshost) carries its data beside the rest.
	rawData []byte
}

// CapLimits is the capability a daemon reports in the handshake's caps
// when it applies create's limits field. Fountain's daemon ignores
// unknown fields, so a platform must not send limits to a daemon without
// it: they would be accepted and dropped.
const CapLimits = "create_limits"

// CapDiskLimit is the capability a daemon reports when it also applies
// the limits field's disk_bytes (a later field than the others: a daemon
// with create_limits alone would drop it).
const CapDiskLimit = "create_disk_limit"

// CapSignal is the capability a daemon reports when it serves OpSignal
// (its provider can signal a session's command). Fountain's daemon
// answers an unknown op not_supported, so without it a platform answers
// not_supported itself.
const CapSignal = "signal"

// CapReadFile is the capability a daemon reports when it serves
// OpReadFile (its provider reads files: sandbox.FileReader or
// sandbox.FileOpener). Fountain's daemon has no read_file and reports
// no caps, so a platform claims file reads (sandbox.FileReader) only for
// a runner that reports it, and answers not_supported itself otherwise.
const CapReadFile = "read_file"

// CapAttachOffset is the capability a daemon reports when an attach's
// offset field starts the session's output at that byte: the daemon
// drops the bytes before it (their checksum must be offset_crc, else the
// stream ends with an error frame unavailable/replay_mismatch) instead of
// sending them. A platform resuming a slow reader's stream sends the
// offset to a daemon with it; to one without (Fountain's, which ignores
// unknown fields and replays from byte zero) it sends none and drops the
// bytes itself.
const CapAttachOffset = "attach_offset"

// Limits are a create's resource limits (sandbox.Limits); zero is unset.
type Limits struct {
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	Pids        int   `json:"pids,omitempty"`
	CPUMillis   int   `json:"cpu_millis,omitempty"`
	WallClockMS int64 `json:"wall_clock_ms,omitempty"`
	DiskBytes   int64 `json:"disk_bytes,omitempty"` // to a daemon with CapDiskLimit
}

// Encode is the request's JSON text.
func (r *Request) Encode() ([]byte, error) {
	if r.rawData == nil {
		return json.Marshal(r)
	}
	c := *r
	c.Data, c.rawData = nil, nil
	b, err := json.Marshal(&c)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(b)+len(r.rawData)+12)
	out = append(out, b[:len(b)-1]...) // without its closing brace
	out = append(out, `,"data":"`...)
	out = append(out, r.rawData...)
	return append(out, `"}`...), nil
}

// SetRawData makes b, base64 text in the standard alphabet with padding,
// the request's data, as Data would be but without a copy into a string
// and without JSON encoding it again in Encode (a relayed write_file is
// tens of MiB). Any byte outside that alphabet is refused: the text goes
// into the JSON as it is.
func (r *Request) SetRawData(b []byte) error {
	for i, c := range b {
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '+' || c == '/' || c == '=') {
			return fmt.Errorf("wire: data byte %d (%q) is not base64", i, c)
		}
	}
	r.Data, r.rawData = nil, b
	return nil
}

// DecodeRequest parses a request frame as the daemon does. A frame that is
// not a JSON object with a string op is an error; when the frame still had
// an integer id, it is returned with the error so the daemon can answer
// invalid instead of leaving the caller waiting.
func DecodeRequest(b []byte) (*Request, error) {
	var r Request
	err := json.Unmarshal(b, &r)
	if err == nil && r.Op == "" {
		err = errors.New("request has no op")
	}
	if err != nil {
		var probe struct {
			ID json.RawMessage `json:"id"`
		}
		if json.Unmarshal(b, &probe) == nil {
			if id, ok := parseInt(probe.ID); ok {
				return &Request{ID: id}, err
			}
		}
		return nil, err
	}
	return &r, nil
}

// EncodeData is the protocol's base64: standard alphabet with padding.
func EncodeData(p []byte) string { return base64.StdEncoding.EncodeToString(p) }

// StrPtr returns &s.
func StrPtr(s string) *string { return &s }

// DecodeData decodes padded standard base64.
func DecodeData(s string) ([]byte, error) { return base64.StdEncoding.DecodeString(s) }

// Reply is one daemon → platform answer.
type Reply struct {
	ID     int64
	OK     bool
	Result json.RawMessage // "{}" when the op returns nothing
	Error  string
	Detail string
	// Malformed is set by Decode for a frame with an integer id but no
	// boolean ok; the platform answers such a reply with a provider error.
	Malformed bool
	Raw       []byte
}

// AppendOK appends a success reply with the given result object (nil means {}).
func AppendOK(dst []byte, id int64, result []byte) []byte {
	dst = append(dst, `{"id":`...)
	dst = strconv.AppendInt(dst, id, 10)
	dst = append(dst, `,"ok":true,"result":`...)
	if len(result) == 0 {
		result = []byte("{}")
	}
	dst = append(dst, result...)
	return append(dst, '}')
}

// AppendError appends a failure reply; detail is always present, possibly "".
func AppendError(dst []byte, id int64, code, detail string) []byte {
	dst = append(dst, `{"id":`...)
	dst = strconv.AppendInt(dst, id, 10)
	dst = append(dst, `,"ok":false,"error":`...)
	dst = appendString(dst, code)
	dst = append(dst, `,"detail":`...)
	dst = appendString(dst, detail)
	return append(dst, '}')
}

// Stream is one stream frame.
type Stream struct {
	Kind      string // StreamStdout, StreamStderr, StreamExit or StreamError
	SessionID string
	Data      []byte // stdout/stderr
	Code      int    // exit
	ReplayFor int64  // 0 for a live frame
	Error     string // StreamError: the code, as in a reply
	Detail    string // StreamError
	// Malformed is set by Decode on an exit frame whose code is not an
	// integer: it must not be read as an exit code (never a fabricated 0).
	Malformed bool
}

// Live reports whether the frame is live (not replayed for one request).
func (s *Stream) Live() bool { return s.ReplayFor == 0 }

// AppendStream appends the frame's JSON.
func AppendStream(dst []byte, s *Stream) []byte {
	dst = append(dst, `{"stream":`...)
	dst = appendString(dst, s.Kind)
	dst = append(dst, `,"session_id":`...)
	dst = appendString(dst, s.SessionID)
	switch s.Kind {
	case StreamExit:
		dst = append(dst, `,"code":`...)
		dst = strconv.AppendInt(dst, int64(s.Code), 10)
	case StreamError:
		dst = append(dst, `,"error":`...)
		dst = appendString(dst, s.Error)
		dst = append(dst, `,"detail":`...)
		dst = appendString(dst, s.Detail)
	default:
		dst = append(dst, `,"data":"`...)
		dst = base64.StdEncoding.AppendEncode(dst, s.Data)
		dst = append(dst, '"')
	}
	if s.ReplayFor != 0 {
		dst = append(dst, `,"replay_for":`...)
		dst = strconv.AppendInt(dst, s.ReplayFor, 10)
	}
	return append(dst, '}')
}

// appendString appends s as a JSON string.
func appendString(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 {
			b, _ := json.Marshal(s)
			return append(dst, b...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}

// Session is one entry of a list_sessions reply: id, command, created_at
// and last_activity_at (RFC 3339 UTC, second precision), tty (always
// false) and exit_code, present only once the session finished (spec
// §1.5).
//
// State is an extension: SessionRunning, SessionExited or SessionLost
// (ended with no exit status known), so that the platform can tell a
// quiet running session (a detached `sleep 3600`) from an ended one
// without guessing from exit_code. Fountain's daemon omits it, and so
// does a daemon whose provider does not know; RunState then reads the
// state from exit_code as the spec defines it: finished when present,
// running when absent. Running is the safe reading for the platform: it
// keeps a sandbox from being parked, never parks one in use.
type Session struct {
	ID             string `json:"id"`
	Command        string `json:"command"`
	CreatedAt      string `json:"created_at,omitempty"`
	LastActivityAt string `json:"last_activity_at,omitempty"`
	TTY            bool   `json:"tty"`
	ExitCode       *int   `json:"exit_code,omitempty"`
	State          string `json:"state,omitempty"`
}

// The session states of Session.State.
const (
	SessionRunning = "running"
	SessionExited  = "exited"
	SessionLost    = "lost"
)

// RunState is the session's state: State when it is one of the three,
// else SessionExited when ExitCode is present, else SessionRunning.
func (s *Session) RunState() string {
	switch s.State {
	case SessionRunning, SessionExited, SessionLost:
		return s.State
	}
	if s.ExitCode != nil {
		return SessionExited
	}
	return SessionRunning
}
