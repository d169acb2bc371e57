package e2b

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// Envelope flags of the Connect protocol's streaming framing.
const (
	FlagMessage    byte = 0
	FlagCompressed byte = 1
	FlagEndStream  byte = 2
)

// MaxEnvelope bounds one envelope's payload.
const MaxEnvelope = 16 << 20

// AppendEnvelope appends one Connect envelope (1 flag byte, 4-byte
// big-endian length, payload) to b.
func AppendEnvelope(b []byte, flag byte, payload []byte) []byte {
	b = append(b, flag)
	b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
	return append(b, payload...)
}

// EnvelopeReader reads Connect envelopes from a stream.
type EnvelopeReader struct {
	r   *bufio.Reader
	hdr [5]byte
}

// NewEnvelopeReader returns a reader of the envelopes in r.
func NewEnvelopeReader(r io.Reader) *EnvelopeReader {
	return &EnvelopeReader{r: bufio.NewReader(r)}
}

// Next returns the next envelope. It returns io.EOF at a clean end between
// envelopes and io.ErrUnexpectedEOF for a stream cut inside one.
func (e *EnvelopeReader) Next() (flag byte, payload []byte, err error) {
	if _, err := io.ReadFull(e.r, e.hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(e.hdr[1:])
	if n > MaxEnvelope {
		return 0, nil, fmt.Errorf("connect envelope of %d bytes exceeds %d", n, MaxEnvelope)
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(e.r, payload); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return e.hdr[0], payload, nil
}

// Wire types of envd's process service, in the proto3 JSON mapping.
type (
	processConfig struct {
		Cmd  string            `json:"cmd"`
		Args []string          `json:"args"`
		Envs map[string]string `json:"envs"`
		Cwd  string            `json:"cwd,omitempty"`
	}
	startRequest struct {
		Process processConfig `json:"process"`
		Tag     string        `json:"tag,omitempty"`
		Stdin   *bool         `json:"stdin,omitempty"`
	}
	selector struct {
		Pid uint32 `json:"pid,omitempty"`
		Tag string `json:"tag,omitempty"`
	}
	processInfo struct {
		Config *processConfig `json:"config"`
		Pid    uint32         `json:"pid"`
		Tag    string         `json:"tag"`
	}
	processEvent struct {
		Start *struct {
			Pid uint32 `json:"pid"`
		} `json:"start"`
		Data *struct {
			Stdout string `json:"stdout"`
			Stderr string `json:"stderr"`
			Pty    string `json:"pty"`
		} `json:"data"`
		End *struct {
			ExitCode  *int   `json:"exitCode"`
			ExitCode2 *int   `json:"exit_code"`
			Exited    bool   `json:"exited"`
			Status    string `json:"status"`
			Error     string `json:"error"`
		} `json:"end"`
		Keepalive *struct{} `json:"keepalive"`
	}
	startResponse struct {
		Event *processEvent `json:"event"`
	}
	endStream struct {
		Error *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
)

// decodeB64 decodes a proto3 JSON bytes field (standard or URL alphabet,
// padded or not). Invalid input decodes to nothing.
func decodeB64(s string) []byte {
	if s == "" {
		return nil
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil {
			return b
		}
	}
	return nil
}

func (p *Provider) envdRequest(ctx context.Context, sandboxID, method, rpath string, body io.Reader) (*http.Request, error) {
	domain, err := p.sandboxDomain(ctx, sandboxID)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, p.cfg.envdURL(sandboxID, domain)+rpath, body)
	if err != nil {
		return nil, sandbox.Invalid("request", err.Error())
	}
	token, err := p.envdToken(ctx, sandboxID)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("X-Access-Token", token)
	}
	req.SetBasicAuth(p.cfg.User, "")
	req.Header.Set("E2b-Sandbox-Id", sandboxID)
	req.Header.Set("E2b-Sandbox-Port", strconv.Itoa(EnvdPort))
	return req, nil
}

// unary calls one unary method of envd's process service: a JSON POST
// whose success is exactly HTTP 200.
func (p *Provider) unary(ctx context.Context, sandboxID, method string, in, out any) error {
	return p.rpc(ctx, sandboxID, "/process.Process/"+method, in, out)
}

// rpc calls one unary Connect method by its path.
func (p *Provider) rpc(ctx context.Context, sandboxID, rpath string, in, out any) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
	defer cancel()
	b, err := json.Marshal(in)
	if err != nil {
		return sandbox.Invalid("request", err.Error())
	}
	req, err := p.envdRequest(ctx, sandboxID, http.MethodPost, rpath, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Connect-Protocol-Version", "1")
	resp, err := p.cfg.HTTPClient.Do(req)
	if err != nil {
		return transportError(ctx, err)
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return transportError(ctx, err)
	}
	if resp.StatusCode != http.StatusOK {
		return httpError(resp.StatusCode, resp.Header, rb)
	}
	if out != nil && len(rb) > 0 {
		if err := json.Unmarshal(rb, out); err != nil {
			return &sandbox.ProviderError{Provider: Name, Reason: "bad_envd_answer", Err: err}
		}
	}
	return nil
}

// startStream opens a Start stream and returns its response body. The wait
// for the answer's headers is bounded by RequestTimeout; the body is then
// watched by the command's stall detector. Closing the body (or cancelling
// ctx) ends the stream.
func (p *Provider) startStream(ctx context.Context, sandboxID string, sr startRequest) (io.ReadCloser, error) {
	if sr.Process.Args == nil {
		sr.Process.Args = []string{}
	}
	if sr.Process.Envs == nil {
		sr.Process.Envs = map[string]string{}
	}
	b, err := json.Marshal(sr)
	if err != nil {
		return nil, sandbox.Invalid("request", err.Error())
	}
	ctx, cancel := context.WithCancel(ctx)
	req, err := p.envdRequest(ctx, sandboxID, http.MethodPost, "/process.Process/Start",
		bytes.NewReader(AppendEnvelope(nil, FlagMessage, b)))
	if err != nil {
		cancel()
		return nil, err
	}
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("Connect-Protocol-Version", "1")
	req.Header.Set("Keepalive-Ping-Interval", strconv.Itoa(seconds(p.cfg.KeepaliveInterval)))
	var timedOut atomic.Bool
	t := time.AfterFunc(p.cfg.RequestTimeout, func() { timedOut.Store(true); cancel() })
	resp, err := p.cfg.HTTPClient.Do(req)
	t.Stop()
	if err != nil {
		cancel()
		if timedOut.Load() {
			return nil, sandbox.Unavailable(sandbox.ReasonTimeout, err)
		}
		return nil, transportError(ctx, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer cancel()
		defer resp.Body.Close()
		rb, _ := io.ReadAll(io.LimitReader(resp.Body, maxBody))
		return nil, httpError(resp.StatusCode, resp.Header, rb)
	}
	return &cancelBody{ReadCloser: resp.Body, cancel: cancel}, nil
}

type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c *cancelBody) Close() error {
	c.cancel()
	return c.ReadCloser.Close()
}

func (p *Provider) listProcesses(ctx context.Context, sandboxID string) ([]processInfo, error) {
	var out struct {
		Processes []processInfo `json:"processes"`
	}
	if err := p.retryTransition(ctx, "list processes", func(ctx context.Context) error {
		return p.unary(ctx, sandboxID, "List", struct{}{}, &out)
	}); err != nil {
		return nil, err
	}
	return out.Processes, nil
}

// writeFile uploads data to path through envd's files API (multipart, one
// field "file"); envd creates the parent directories. The upload replaces
// the file whole, so it is sent again while the sandbox is changing state
// (the proxy's 409 comes before envd sees anything).
func (p *Provider) writeFile(ctx context.Context, sandboxID, fpath string, data []byte) error {
	return p.retryTransition(ctx, "write file", func(ctx context.Context) error { return p.writeFileOnce(ctx, sandboxID, fpath, data) })
}

func (p *Provider) writeFileOnce(ctx context.Context, sandboxID, fpath string, data []byte) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
	defer cancel()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	fw, err := mw.CreateFormFile("file", path.Base(fpath))
	if err == nil {
		_, err = fw.Write(data)
	}
	if err == nil {
		err = mw.Close()
	}
	if err != nil {
		return sandbox.Invalid("request", err.Error())
	}
	q := url.Values{"path": {fpath}, "username": {p.cfg.User}}
	req, err := p.envdRequest(ctx, sandboxID, http.MethodPost, "/files?"+q.Encode(), &buf)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", mw.FormDataContentType())
	resp, err := p.cfg.HTTPClient.Do(req)
	if err != nil {
		return transportError(ctx, err)
	}
	defer resp.Body.Close()
	rb, _ := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return httpError(resp.StatusCode, resp.Header, rb)
	}
	return nil
}

// readFile downloads path through envd's files API; a 404 is ErrNotFound
// (of the file, not the sandbox).
func (p *Provider) readFile(ctx context.Context, sandboxID, fpath string, limit int64) ([]byte, error) {
	return sandbox.RetryValue(ctx, p.transitionBackoff("read file"), func(ctx context.Context) ([]byte, error) { return p.readFileOnce(ctx, sandboxID, fpath, limit) })
}

func (p *Provider) readFileOnce(ctx context.Context, sandboxID, fpath string, limit int64) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
	defer cancel()
	q := url.Values{"path": {fpath}, "username": {p.cfg.User}}
	req, err := p.envdRequest(ctx, sandboxID, http.MethodGet, "/files?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.cfg.HTTPClient.Do(req)
	if err != nil {
		return nil, transportError(ctx, err)
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return nil, transportError(ctx, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, httpError(resp.StatusCode, resp.Header, rb)
	}
	return rb, nil
}

var errNoEnd = errors.New("stream ended without an end event")

type dirEntry struct {
	Name         string    `json:"name"`
	Type         string    `json:"type"`
	Path         string    `json:"path"`
	ModifiedTime time.Time `json:"modifiedTime"`
}

// listDir lists a directory through envd's filesystem service (ListDir,
// depth 1). A missing directory is ErrNotFound.
func (p *Provider) listDir(ctx context.Context, sandboxID, dir string) ([]dirEntry, error) {
	var out struct {
		Entries []dirEntry `json:"entries"`
	}
	err := p.retryTransition(ctx, "list directory", func(ctx context.Context) error {
		return p.rpc(ctx, sandboxID, "/filesystem.Filesystem/ListDir", map[string]any{"path": dir, "depth": 1}, &out)
	})
	return out.Entries, err
}
