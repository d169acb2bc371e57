package wire

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"strconv"
	"unicode/utf8"
)

// ErrNotJSON is Decode's error for a frame that is not valid JSON text; the
// platform closes the socket with CloseUnsupported.
var ErrNotJSON = errors.New("wire: frame is not JSON")

// Kind classifies a decoded daemon → platform frame.
type Kind int

// The frame kinds, in the spec's classification order.
const (
	KindOther  Kind = iota // valid JSON that is neither; logged and ignored
	KindReply              // has an integer id
	KindStream             // has string stream and session_id
)

// Frame is a decoded daemon → platform frame.
type Frame struct {
	Kind   Kind
	Reply  *Reply
	Stream *Stream
}

// span is a raw JSON value inside the frame.
type span struct {
	b   []byte
	set bool
}

type fields struct {
	id, ok, result, errc, detail, stream, sessionID, data, code, replayFor span

	decoded    []byte // the data value, when fastData decoded it
	hasDecoded bool
}

// Decode classifies and decodes one frame received by the platform: an
// integer id makes a reply, else string stream and session_id make a stream
// frame, else it is KindOther. It never panics; input that is not JSON is
// ErrNotJSON. Stream data that is not valid base64 is passed through as the
// raw string; missing or non-string data is empty.
func Decode(b []byte) (Frame, error) {
	var f fields
	p := parser{b: b}
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == '{' {
		if !p.object(&f) {
			return Frame{}, ErrNotJSON
		}
	} else if !p.value() {
		return Frame{}, ErrNotJSON
	}
	p.ws()
	if p.i != len(p.b) {
		return Frame{}, ErrNotJSON
	}
	if f.id.set && isInt(f.id.b) {
		return Frame{Kind: KindReply, Reply: f.reply(b)}, nil
	}
	if f.stream.set && f.sessionID.set {
		kind, ok1 := str(f.stream.b)
		sid, ok2 := str(f.sessionID.b)
		if ok1 && ok2 {
			return Frame{Kind: KindStream, Stream: f.streamFrame(kind, sid)}, nil
		}
	}
	return Frame{Kind: KindOther}, nil
}

func (f *fields) reply(raw []byte) *Reply {
	id, ok := parseInt(f.id.b)
	if !ok {
		id = -1 // an integer out of range matches no request
	}
	r := &Reply{ID: id}
	switch string(f.ok.b) {
	case "true":
		r.OK = true
		r.Result = json.RawMessage("{}")
		if f.result.set && string(f.result.b) != "null" {
			r.Result = append(json.RawMessage(nil), f.result.b...)
		}
	case "false":
		r.Error, _ = str(f.errc.b)
		if r.Error == "" && f.errc.set && len(f.errc.b) > 0 {
			r.Error = string(f.errc.b)
		}
		r.Detail, _ = str(f.detail.b)
		if f.detail.set && r.Detail == "" && string(f.detail.b) != "null" && f.detail.b[0] != '"' {
			r.Detail = string(f.detail.b)
		}
	default:
		r.Malformed = true
		r.Raw = append([]byte(nil), raw...)
	}
	return r
}

func (f *fields) streamFrame(kind, sid string) *Stream {
	s := &Stream{Kind: kind, SessionID: sid}
	if f.replayFor.set && isInt(f.replayFor.b) {
		s.ReplayFor, _ = parseInt(f.replayFor.b)
	}
	switch kind {
	case StreamExit:
		s.Code = -1
		if !f.code.set {
			s.Code = 0 // the platform defaults a missing code to 0 (spec §1.3)
		} else if n, ok := parseInt(f.code.b); ok && isInt(f.code.b) && n >= -1<<31 && n < 1<<31 {
			s.Code = int(n)
		} else {
			s.Malformed = true // never read as an exit code; the platform reports it
			s.Detail = string(f.code.b)
		}
	case StreamError:
		s.Error, _ = str(f.errc.b)
		s.Detail, _ = str(f.detail.b)
	default:
		if f.hasDecoded {
			s.Data = f.decoded
			break
		}
		b := f.data.b
		if !f.data.set || len(b) < 2 || b[0] != '"' {
			break
		}
		if in := b[1 : len(b)-1]; bytes.IndexByte(in, '\\') < 0 {
			dec := make([]byte, base64.StdEncoding.DecodedLen(len(in)))
			if n, err := base64.StdEncoding.Decode(dec, in); err == nil {
				s.Data = dec[:n]
			} else {
				s.Data = append([]byte(nil), in...)
			}
		} else if d, ok := str(b); ok {
			if dec, err := base64.StdEncoding.DecodeString(d); err == nil {
				s.Data = dec
			} else {
				s.Data = []byte(d)
			}
		}
	}
	return s
}

// isInt reports whether a raw JSON value is an integer literal.
func isInt(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	i := 0
	if b[0] == '-' {
		i++
	}
	if i == len(b) {
		return false
	}
	for ; i < len(b); i++ {
		if b[i] < '0' || b[i] > '9' {
			return false
		}
	}
	return true
}

func parseInt(b []byte) (int64, bool) {
	if !isInt(b) {
		return 0, false
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	return n, err == nil
}

// str decodes a raw JSON string value.
func str(b []byte) (string, bool) {
	if len(b) < 2 || b[0] != '"' {
		return "", false
	}
	in := b[1 : len(b)-1]
	if bytes.IndexByte(in, '\\') < 0 && utf8.Valid(in) {
		return string(in), true
	}
	// Escapes, or invalid UTF-8 (which encoding/json turns into U+FFFD).
	var s string
	if json.Unmarshal(b, &s) != nil {
		return "", false
	}
	return s, true
}

// parser validates JSON text (RFC 8259, like encoding/json: bytes ≥ 0x20
// are accepted inside strings without a UTF-8 check) and records the
// top-level fields the protocol reads.
type parser struct {
	b     []byte
	i     int
	depth int
}

const maxDepth = 10000

func (p *parser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *parser) object(f *fields) bool {
	p.depth++
	if p.depth > maxDepth {
		return false
	}
	defer func() { p.depth-- }()
	p.i++ // '{'
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == '}' {
		p.i++
		return true
	}
	for {
		p.ws()
		ks := p.i
		if !p.string() {
			return false
		}
		key := p.b[ks:p.i]
		p.ws()
		if p.i >= len(p.b) || p.b[p.i] != ':' {
			return false
		}
		p.i++
		p.ws()
		vs := p.i
		if f != nil && p.depth == 1 && string(key) == `"data"` && p.fastData(f) {
			// validated and decoded in one pass
		} else if !p.value() {
			return false
		} else if f != nil {
			f.set(key, p.b[vs:p.i])
		}
		p.ws()
		if p.i >= len(p.b) {
			return false
		}
		switch p.b[p.i] {
		case ',':
			p.i++
		case '}':
			p.i++
			return true
		default:
			return false
		}
	}
}

func (f *fields) set(key, v []byte) {
	k, ok := str(key)
	if !ok {
		return
	}
	var s *span
	switch k {
	case "id":
		s = &f.id
	case "ok":
		s = &f.ok
	case "result":
		s = &f.result
	case "error":
		s = &f.errc
	case "detail":
		s = &f.detail
	case "stream":
		s = &f.stream
	case "session_id":
		s = &f.sessionID
	case "data":
		s = &f.data
		f.decoded, f.hasDecoded = nil, false
	case "code":
		s = &f.code
	case "replay_for":
		s = &f.replayFor
	default:
		return
	}
	*s = span{b: v, set: true} // a later duplicate key wins, as in encoding/json
}

// fastData handles a top-level "data" string made only of base64 bytes:
// decoding it proves it is a valid JSON string (the alphabet holds no quote,
// backslash or control byte), so the value is scanned once, not twice.
func (p *parser) fastData(f *fields) bool {
	if p.i >= len(p.b) || p.b[p.i] != '"' {
		return false
	}
	j := bytes.IndexByte(p.b[p.i+1:], '"')
	if j < 0 {
		return false
	}
	in := p.b[p.i+1 : p.i+1+j]
	dec := make([]byte, base64.StdEncoding.DecodedLen(len(in)))
	n, err := base64.StdEncoding.Decode(dec, in)
	if err != nil || bytes.IndexByte(in, '\\') >= 0 || bytes.IndexByte(in, '\r') >= 0 || bytes.IndexByte(in, '\n') >= 0 {
		return false
	}
	f.data = span{b: p.b[p.i : p.i+j+2], set: true}
	f.decoded, f.hasDecoded = dec[:n], true
	p.i += j + 2
	return true
}

func (p *parser) value() bool {
	if p.i >= len(p.b) {
		return false
	}
	switch c := p.b[p.i]; {
	case c == '{':
		return p.object(nil)
	case c == '[':
		return p.array()
	case c == '"':
		return p.string()
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	case c == 't':
		return p.lit("true")
	case c == 'f':
		return p.lit("false")
	case c == 'n':
		return p.lit("null")
	}
	return false
}

func (p *parser) lit(s string) bool {
	if !bytes.HasPrefix(p.b[p.i:], []byte(s)) {
		return false
	}
	p.i += len(s)
	return true
}

func (p *parser) array() bool {
	p.depth++
	if p.depth > maxDepth {
		return false
	}
	defer func() { p.depth-- }()
	p.i++ // '['
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == ']' {
		p.i++
		return true
	}
	for {
		p.ws()
		if !p.value() {
			return false
		}
		p.ws()
		if p.i >= len(p.b) {
			return false
		}
		switch p.b[p.i] {
		case ',':
			p.i++
		case ']':
			p.i++
			return true
		default:
			return false
		}
	}
}

func (p *parser) string() bool {
	if p.i >= len(p.b) || p.b[p.i] != '"' {
		return false
	}
	p.i++
	for {
		p.i += plainRun(p.b[p.i:])
		if p.i >= len(p.b) {
			return false
		}
		switch c := p.b[p.i]; {
		case c == '"':
			p.i++
			return true
		case c < 0x20:
			return false
		default: // backslash
			p.i++
			if p.i >= len(p.b) {
				return false
			}
			switch p.b[p.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				p.i++
			case 'u':
				if p.i+5 > len(p.b) {
					return false
				}
				for _, h := range p.b[p.i+1 : p.i+5] {
					if !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
						return false
					}
				}
				p.i += 5
			default:
				return false
			}
		}
	}
}

const (
	lo7   = 0x0101010101010101
	hi7   = 0x8080808080808080
	quote = lo7 * '"'
	bslsh = lo7 * '\\'
)

// plainRun is the length of b's prefix holding no '"', no '\\' and no
// byte below 0x20, eight bytes at a time (the string scan is the hot loop
// of a 32 KiB output frame).
func plainRun(b []byte) int {
	i := 0
	for ; i+8 <= len(b); i += 8 {
		w := binary.LittleEndian.Uint64(b[i:])
		q, s := w^quote, w^bslsh
		if ((w-lo7*0x20)|(q-lo7)|(s-lo7))&^w&hi7 != 0 {
			break
		}
	}
	for ; i < len(b); i++ {
		if c := b[i]; c == '"' || c == '\\' || c < 0x20 {
			return i
		}
	}
	return i
}

func (p *parser) number() bool {
	if p.b[p.i] == '-' {
		p.i++
	}
	if p.i >= len(p.b) {
		return false
	}
	switch c := p.b[p.i]; {
	case c == '0':
		p.i++
	case c >= '1' && c <= '9':
		for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
			p.i++
		}
	default:
		return false
	}
	if p.i < len(p.b) && p.b[p.i] == '.' {
		p.i++
		if !p.digits() {
			return false
		}
	}
	if p.i < len(p.b) && (p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		p.i++
		if p.i < len(p.b) && (p.b[p.i] == '+' || p.b[p.i] == '-') {
			p.i++
		}
		if !p.digits() {
			return false
		}
	}
	return true
}

func (p *parser) digits() bool {
	s := p.i
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		p.i++
	}
	return p.i > s
}
