package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/sandbox"
)

func TestOpsAreTheFourteen(t *testing.T) {
	want := "create get destroy list suspend resume write_file exec spawn stdin stdin_close detach list_sessions attach"
	if got := strings.Join(Ops, " "); got != want {
		t.Fatalf("Ops = %q, want %q", got, want)
	}
}

func TestRequestJSON(t *testing.T) {
	r := &Request{ID: 12, Op: OpSpawn, Name: "runner-x", Cmd: "bash", Args: []string{"-lc", "echo hi"},
		Env: [][]string{{"K", "v"}}, Dir: StrPtr("/home/sprite"), Stdin: true, Detachable: true}
	b, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":12,"op":"spawn","name":"runner-x","cmd":"bash","args":["-lc","echo hi"],"env":[["K","v"]],"dir":"/home/sprite","stdin":true,"detachable":true}`
	if string(b) != want {
		t.Fatalf("got  %s\nwant %s", b, want)
	}
	// Null is accepted wherever a field is optional; unknown fields are ignored.
	in := `{"id":3,"op":"write_file","name":"sb","path":"x","data":"QT0xCg==","mode":null,"dir":null,"timeout_ms":null,"extra":[1,{"a":2}]}`
	got, err := DecodeRequest([]byte(in))
	if err != nil || got.ID != 3 || got.Op != OpWriteFile || got.Mode != nil || got.Dir != nil || *got.Data != "QT0xCg==" {
		t.Fatalf("DecodeRequest = %+v, %v", got, err)
	}
	// A bad frame with an integer id still yields the id.
	got, err = DecodeRequest([]byte(`{"id":9,"op":7}`))
	if err == nil || got == nil || got.ID != 9 {
		t.Fatalf("bad frame with id: %+v, %v", got, err)
	}
	if got, err := DecodeRequest([]byte(`nope`)); err == nil || got != nil {
		t.Fatalf("non-JSON request: %+v, %v", got, err)
	}
}

func TestReplyAndStreamJSON(t *testing.T) {
	cases := []struct{ got, want string }{
		{string(AppendOK(nil, 3, nil)), `{"id":3,"ok":true,"result":{}}`},
		{string(AppendOK(nil, 12, []byte(`{"session_id":"s-1767225600-3"}`))), `{"id":12,"ok":true,"result":{"session_id":"s-1767225600-3"}}`},
		{string(AppendError(nil, 4, CodeNotFound, "x")), `{"id":4,"ok":false,"error":"not_found","detail":"x"}`},
		{string(AppendError(nil, 13, CodeCommandExited, "")), `{"id":13,"ok":false,"error":"command_exited","detail":""}`},
		{string(AppendStream(nil, &Stream{Kind: StreamStdout, SessionID: "s-1", Data: []byte("hi\n"), ReplayFor: 12})), `{"stream":"stdout","session_id":"s-1","data":"aGkK","replay_for":12}`},
		{string(AppendStream(nil, &Stream{Kind: StreamStderr, SessionID: "s-1", Data: []byte("x")})), `{"stream":"stderr","session_id":"s-1","data":"eA=="}`},
		{string(AppendStream(nil, &Stream{Kind: StreamExit, SessionID: "s-1", Code: 0})), `{"stream":"exit","session_id":"s-1","code":0}`},
		{string(AppendError(nil, 1, "invalid", "a\"b\n")), `{"id":1,"ok":false,"error":"invalid","detail":"a\"b\n"}`},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("got  %s\nwant %s", c.got, c.want)
		}
		if !json.Valid([]byte(c.got)) {
			t.Errorf("not valid JSON: %s", c.got)
		}
	}
}

func TestBase64IsPaddedStandard(t *testing.T) {
	if EncodeData([]byte("x")) != "eA==" {
		t.Fatal("not padded")
	}
	if _, err := DecodeData("eA"); err == nil {
		t.Fatal("unpadded base64 accepted")
	}
}

func TestDecodeClassifies(t *testing.T) {
	cases := []struct {
		in   string
		kind Kind
		err  error
	}{
		{`{"id":1,"ok":true,"result":{"a":1}}`, KindReply, nil},
		{`{"id":1,"ok":true}`, KindReply, nil},
		{`{"id":0,"ok":true,"result":{}}`, KindReply, nil},
		{`{"id":"1","ok":true}`, KindOther, nil},
		{`{"id":1.0,"ok":true}`, KindOther, nil},
		{`{"stream":"stdout","session_id":"s","data":"aGk="}`, KindStream, nil},
		{`{"stream":"stdout"}`, KindOther, nil},
		{`{"hello":1}`, KindOther, nil},
		{`[1,2]`, KindOther, nil},
		{` 3 `, KindOther, nil},
		{`nope`, 0, ErrNotJSON},
		{``, 0, ErrNotJSON},
		{`{"id":1,}`, 0, ErrNotJSON},
		{`{"id":1} x`, 0, ErrNotJSON},
		{"{\"a\":\"\x01\"}", 0, ErrNotJSON},
	}
	for _, c := range cases {
		f, err := Decode([]byte(c.in))
		if !errors.Is(err, c.err) || (err == nil && f.Kind != c.kind) {
			t.Errorf("Decode(%q) = %v, %v; want kind %v, err %v", c.in, f.Kind, err, c.kind, c.err)
		}
	}
}

func TestDecodeReplyFields(t *testing.T) {
	f, _ := Decode([]byte(`{"id":7,"ok":true}`))
	if string(f.Reply.Result) != "{}" || f.Reply.Err() != nil {
		t.Fatalf("missing result: %+v", f.Reply)
	}
	f, _ = Decode([]byte(`{"id":7,"ok":false,"error":"invalid","detail":null}`))
	var inv *sandbox.InvalidError
	if !errors.As(f.Reply.Err(), &inv) {
		t.Fatalf("invalid: %v", f.Reply.Err())
	}
	f, _ = Decode([]byte(`{"id":7,"result":{}}`))
	var pe *sandbox.ProviderError
	if !f.Reply.Malformed || !errors.As(f.Reply.Err(), &pe) || pe.Reason != "malformed_reply" {
		t.Fatalf("malformed: %+v %v", f.Reply, f.Reply.Err())
	}
	f, _ = Decode([]byte(`{"id":99999999999999999999999,"ok":true}`))
	if f.Kind != KindReply || f.Reply.ID != -1 {
		t.Fatalf("huge id: %+v", f.Reply)
	}
}

func TestDecodeStreamFields(t *testing.T) {
	f, _ := Decode([]byte(`{"stream":"stdout","session_id":"s","data":"aGkK","replay_for":12}`))
	if string(f.Stream.Data) != "hi\n" || f.Stream.ReplayFor != 12 || f.Stream.Live() {
		t.Fatalf("stdout: %+v", f.Stream)
	}
	f, _ = Decode([]byte(`{"stream":"stdout","session_id":"s","data":"not base64!"}`))
	if string(f.Stream.Data) != "not base64!" {
		t.Fatalf("raw pass-through: %q", f.Stream.Data)
	}
	f, _ = Decode([]byte(`{"stream":"stderr","session_id":"s","data":5}`))
	if len(f.Stream.Data) != 0 {
		t.Fatalf("non-string data: %q", f.Stream.Data)
	}
	f, _ = Decode([]byte(`{"stream":"stdout","session_id":"s\u0031","data":"a\u0047k="}`))
	if f.Stream.SessionID != "s1" || string(f.Stream.Data) != "hi" {
		t.Fatalf("escapes: %+v", f.Stream)
	}
	f, _ = Decode([]byte(`{"stream":"exit","session_id":"s","code":3}`))
	if f.Stream.Code != 3 || f.Stream.Malformed {
		t.Fatalf("exit: %+v", f.Stream)
	}
	f, _ = Decode([]byte(`{"stream":"exit","session_id":"s"}`))
	if f.Stream.Code != 0 || f.Stream.Malformed {
		t.Fatalf("exit without code: %+v", f.Stream)
	}
	f, _ = Decode([]byte(`{"stream":"exit","session_id":"s","code":"x"}`))
	if !f.Stream.Malformed {
		t.Fatalf("exit with a bad code must not read as an exit: %+v", f.Stream)
	}
	f, _ = Decode([]byte(`{"stream":"error","session_id":"s","error":"unavailable","detail":"closed_before_exit"}`))
	if f.Stream.Kind != StreamError || !sandbox.IsClosedBeforeExit(ErrorFrom(f.Stream.Error, f.Stream.Detail)) {
		t.Fatalf("error frame: %+v", f.Stream)
	}
}

func TestErrorNormalisation(t *testing.T) {
	// Spec §1.6.
	if !errors.Is(ErrorFrom("not_found", "x"), sandbox.ErrNotFound) ||
		!errors.Is(ErrorFrom("command_exited", ""), sandbox.ErrCommandExited) ||
		!errors.Is(ErrorFrom("not_supported", "op"), sandbox.ErrNotSupported) {
		t.Fatal("sentinels")
	}
	var inv *sandbox.InvalidError
	if !errors.As(ErrorFrom("invalid", "bad sandbox name"), &inv) {
		t.Fatal("invalid")
	}
	var una *sandbox.UnavailableError
	if !errors.As(ErrorFrom("unavailable", "mkdir failed"), &una) || !sandbox.Transient(una) {
		t.Fatal("unavailable")
	}
	var wf *sandbox.WriteFailedError
	if !errors.As(ErrorFrom("write_failed", "pipe"), &wf) {
		t.Fatal("write_failed")
	}
	var pe *sandbox.ProviderError
	if !errors.As(ErrorFrom("weird", "d"), &pe) || pe.Provider != "runner" || pe.Reason != "weird" || pe.Err.Error() != "d" {
		t.Fatalf("provider: %v", pe)
	}
	// Round trips through the daemon's encoding.
	for _, err := range []error{
		sandbox.ErrNotFound, sandbox.ErrCommandExited, sandbox.ErrNotSupported, sandbox.ErrAlreadyExists,
		sandbox.ErrTruncated, sandbox.Invalid("name", "bad"), sandbox.ClosedBeforeExit(),
		sandbox.ExecTimeout(1500 * time.Millisecond), &sandbox.WriteFailedError{Err: errors.New("pipe")},
		&sandbox.DeniedError{Reason: "http"}, &sandbox.RateLimitedError{RetryAfter: 3 * time.Second},
		&sandbox.RestoreFailedError{Detail: "x"},
	} {
		code, detail := ErrorCode(err)
		back := ErrorFrom(code, detail)
		if sandbox.Kind(back) != sandbox.Kind(err) || back.Error() != err.Error() {
			t.Errorf("%v → %s %q → %v", err, code, detail, back)
		}
	}
}

func TestAppendStreamDecodesBack(t *testing.T) {
	data := bytes.Repeat([]byte{0, 1, 2, 0xff, '"', '\\'}, MaxChunk/6)
	b := AppendStream(nil, &Stream{Kind: StreamStdout, SessionID: "s-9", Data: data, ReplayFor: 4})
	f, err := Decode(b)
	if err != nil || f.Kind != KindStream || !bytes.Equal(f.Stream.Data, data) || f.Stream.ReplayFor != 4 {
		t.Fatalf("round trip failed: %v", err)
	}
}

func BenchmarkDecodeChunk(b *testing.B) {
	f := AppendStream(nil, &Stream{Kind: StreamStdout, SessionID: "s-1", Data: bytes.Repeat([]byte("x"), MaxChunk)})
	b.SetBytes(MaxChunk)
	for i := 0; i < b.N; i++ {
		if _, err := Decode(f); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeChunk(b *testing.B) {
	d := bytes.Repeat([]byte("x"), MaxChunk)
	var buf []byte
	b.SetBytes(MaxChunk)
	for i := 0; i < b.N; i++ {
		buf = AppendStream(buf[:0], &Stream{Kind: StreamStdout, SessionID: "s-1", Data: d})
	}
}

// TestSetRawData: a request whose data was set as its base64 text encodes
// to a frame that decodes to the same request as one with Data set; text
// outside the base64 alphabet (a quote would end the JSON string and
// start fields of its own) is refused.
func TestSetRawData(t *testing.T) {
	data := EncodeData([]byte("hello, \x00\xff world"))
	mode := int64(0o600)
	plain := &Request{ID: 7, Op: OpWriteFile, Name: "runner-x", Path: "/a", Data: &data, Mode: &mode}
	raw := &Request{ID: 7, Op: OpWriteFile, Name: "runner-x", Path: "/a", Mode: &mode}
	if err := raw.SetRawData([]byte(data)); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*Request{plain, raw} {
		b, err := r.Encode()
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeRequest(b)
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if got.ID != 7 || got.Op != OpWriteFile || got.Path != "/a" || got.Data == nil || *got.Data != data || got.Mode == nil || *got.Mode != mode {
			t.Fatalf("%s decodes to %+v", b, got)
		}
	}
	for _, bad := range []string{`aGk="`, `aGk=","op":"destroy`, "aGk=\\", "aGk=\n"} {
		r := &Request{Op: OpWriteFile}
		if err := r.SetRawData([]byte(bad)); err == nil {
			t.Fatalf("SetRawData(%q) accepted", bad)
		}
	}
}

// TestSessionRunState: an entry's state is its state field when it is one
// of the three; else (Fountain's daemon, or an unknown state) exited when
// it has an exit code, running when it has none.
func TestSessionRunState(t *testing.T) {
	for in, want := range map[string]string{
		`{"id":"a","command":"sleep 9","tty":false}`:                          SessionRunning,
		`{"id":"a","command":"true","tty":false,"exit_code":0}`:               SessionExited,
		`{"id":"a","command":"x","tty":false,"state":"running"}`:              SessionRunning,
		`{"id":"a","command":"x","tty":false,"state":"exited","exit_code":3}`: SessionExited,
		`{"id":"a","command":"x","tty":false,"state":"lost"}`:                 SessionLost,
		`{"id":"a","command":"x","tty":false,"state":"paused"}`:               SessionRunning,
		`{"id":"a","command":"x","tty":false,"state":"paused","exit_code":1}`: SessionExited,
	} {
		var s Session
		if err := json.Unmarshal([]byte(in), &s); err != nil {
			t.Fatal(err)
		}
		if got := s.RunState(); got != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
	code := 0
	b, _ := json.Marshal(Session{ID: "a", Command: "sleep 9"})
	if string(b) != `{"id":"a","command":"sleep 9","tty":false}` {
		t.Errorf("an entry without state or exit code encodes as %s", b)
	}
	b, _ = json.Marshal(Session{ID: "a", Command: "true", ExitCode: &code, State: SessionExited})
	if string(b) != `{"id":"a","command":"true","tty":false,"exit_code":0,"state":"exited"}` {
		t.Errorf("an exited entry encodes as %s", b)
	}
}
