package api

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/sandbox"
)

// Preview URLs: a link a browser can open to a port a sandbox publishes,
// without the account's key (which a browser cannot send as a header).
//
// POST /v1/sandboxes/{name}/preview {"port": P, "ttl_seconds": T} answers
// {"url", "origin", "expires_at"}: url is the preview's origin with a
// signed token, origin/.managoat/preview?token=TOKEN. The token is an
// HMAC-SHA256 (Config.PreviewSecret, held by serve, never in a record)
// of what it names: the account, the sandbox's name and creation time
// (a sandbox deleted and made again under the name is another), the
// port, the key that asked for it, its expiry (T seconds, default 15
// minutes, at most 24 hours) and its kind. Opening it on the preview's
// origin exchanges it for a cookie (HttpOnly, SameSite=Lax, Secure under
// TLS, no Domain: that host only) signed the same way, of kind cookie,
// valid for an hour (or until the link's expiry, if later); each request
// with the cookie is then proxied to the port as the API's proxy does
// (proxy.go: its bounds, WebSockets included), with the cookie taken out
// of what the application gets.
//
// Each preview has an origin of its own, a host name
// p{PORT}-{ID}.{Config.PreviewDomain} (default domain "localhost", which
// browsers resolve to loopback; a deployment sets a wildcard DNS name of
// its own) on the platform's port: an application's scripts run on it
// and cannot read another sandbox's preview, the dashboard or the API
// (the same-origin policy), and no cookie of the platform's host reaches
// it. ID is an HMAC of the account, the name and the creation time, so
// a host name says nothing of whom it serves.
//
// Refused (401 unauthorized, the API's error body): a token or cookie
// whose signature does not verify (tampered, or made with another
// secret), that has expired, that names another host than the one it is
// presented on (a link of sandbox A on B's origin, a cookie of port 8000
// replayed on 8001's), whose key has been revoked (revoking the key
// revokes every link and cookie it made) or whose sandbox is gone or was
// made again; a link presented as a cookie or a cookie as a link. The
// answer never says which, and nothing is proxied. Each link is recorded
// (store.PreviewLink) under an id the token and its cookie carry: GET
// /v1/sandboxes/{name}/previews lists a sandbox's links, DELETE
// /v1/sandboxes/{name}/previews/{id} revokes one, and from then on its
// token and every cookie made from it are refused too. A link dies with
// its sandbox (it names the record's creation and provider name).

// Preview bounds.
const (
	DefaultPreviewTTL = 15 * time.Minute
	MaxPreviewTTL     = 24 * time.Hour
	// PreviewCookieTTL is how long the cookie a link is exchanged for is
	// valid at least.
	PreviewCookieTTL = time.Hour
	// PreviewCookie is the cookie's name.
	PreviewCookie = "managoat_preview"
	// PreviewExchangePath is the path of a preview's origin that
	// exchanges a link's token for the cookie.
	PreviewExchangePath = "/.managoat/preview"
)

// PreviewRequest is POST /v1/sandboxes/{name}/preview's body.
type PreviewRequest struct {
	Port       int `json:"port"`
	TTLSeconds int `json:"ttl_seconds,omitempty"`
}

// PreviewURL is its answer. ID names the link for
// DELETE /v1/sandboxes/{name}/previews/{id}.
type PreviewURL struct {
	ID        string    `json:"id"`
	URL       string    `json:"url"`
	Origin    string    `json:"origin"`
	ExpiresAt time.Time `json:"expires_at"`
}

// PreviewLink is one entry of GET /v1/sandboxes/{name}/previews.
type PreviewLink struct {
	ID        string     `json:"id"`
	Port      int        `json:"port"`
	Origin    string     `json:"origin"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt time.Time  `json:"expires_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// previewClaims are what a token names.
type previewClaims struct {
	V       int    `json:"v"`
	Kind    string `json:"k"` // link or cookie
	Account string `json:"a"`
	Name    string `json:"n"`
	Created int64  `json:"c"` // the record's CreatedAt, unix nanoseconds
	Port    int    `json:"p"`
	KeyID   string `json:"i"`
	Exp     int64  `json:"e"` // unix seconds
	Nonce   string `json:"r"`
	Link    string `json:"l"` // the link's id (store.PreviewLink), carried into its cookie
}

// previewState holds the keys derived from the secret.
type previewState struct {
	once      sync.Once
	sign, lbl []byte
}

func (s *Server) previewKeys() *previewState {
	p := &s.preview
	p.once.Do(func() {
		secret := s.cfg.PreviewSecret
		if len(secret) == 0 {
			secret = make([]byte, 32)
			_, _ = rand.Read(secret)
		}
		derive := func(use string) []byte {
			m := hmac.New(sha256.New, secret)
			m.Write([]byte("managoat preview " + use))
			return m.Sum(nil)
		}
		p.sign, p.lbl = derive("token"), derive("label")
	})
	return p
}

func (s *Server) previewDomain() string {
	if s.cfg.PreviewDomain != "" {
		return strings.ToLower(strings.Trim(s.cfg.PreviewDomain, "."))
	}
	return "localhost"
}

// previewLabel is the host label of the preview of port of the record.
func (s *Server) previewLabel(account, name string, created int64, port int) string {
	m := hmac.New(sha256.New, s.previewKeys().lbl)
	fmt.Fprintf(m, "%s\x00%s\x00%d", account, name, created)
	return "p" + strconv.Itoa(port) + "-" + hex.EncodeToString(m.Sum(nil)[:10])
}

func (s *Server) signPreview(c previewClaims) string {
	c.V = 1
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	c.Nonce = hex.EncodeToString(nonce[:])
	b, _ := json.Marshal(c)
	payload := base64.RawURLEncoding.EncodeToString(b)
	m := hmac.New(sha256.New, s.previewKeys().sign)
	m.Write([]byte(payload))
	return payload + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

var errPreview = errors.New("preview: the link or cookie is not valid here (expired, revoked, tampered, or for another sandbox or port)")

// verifyPreview checks tok's signature, kind, expiry and that it names
// the host label it is presented on.
func (s *Server) verifyPreview(tok, kind, label string) (previewClaims, error) {
	var c previewClaims
	payload, sig, ok := strings.Cut(tok, ".")
	if !ok || len(tok) > 2048 {
		return c, errPreview
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil {
		return c, errPreview
	}
	m := hmac.New(sha256.New, s.previewKeys().sign)
	m.Write([]byte(payload))
	if !hmac.Equal(got, m.Sum(nil)) {
		return c, errPreview
	}
	b, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil || json.Unmarshal(b, &c) != nil {
		return c, errPreview
	}
	if c.V != 1 || c.Kind != kind || s.cfg.Now().Unix() >= c.Exp {
		return c, errPreview
	}
	if !hmac.Equal([]byte(label), []byte(s.previewLabel(c.Account, c.Name, c.Created, c.Port))) {
		return c, errPreview
	}
	return c, nil
}

// previewLabelOf is the preview label of the request's host, or "" when
// the host is not a preview's.
func (s *Server) previewLabelOf(r *http.Request) string {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	label, ok := strings.CutSuffix(host, "."+s.previewDomain())
	if !ok || label == "" || strings.Contains(label, ".") || !strings.HasPrefix(label, "p") {
		return ""
	}
	return label
}

// previewOrigin is the origin of a preview of label: the platform's base
// URL's scheme and port under the label's host name.
func (s *Server) previewOrigin(r *http.Request, label string) (string, error) {
	u, err := url.Parse(s.baseURL(r))
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("the platform's base URL %q: %v", s.baseURL(r), err)
	}
	host := label + "." + s.previewDomain()
	if p := u.Port(); p != "" {
		host = net.JoinHostPort(host, p)
	}
	return u.Scheme + "://" + host, nil
}

// previewCreate is POST /v1/sandboxes/{name}/preview.
func (s *Server) previewCreate(w http.ResponseWriter, r *http.Request, k store.Key) {
	var req PreviewRequest
	if err := s.decode(w, r, &req); err != nil {
		writeErr(w, err)
		return
	}
	rec, p, done, ok := s.take(w, r, k)
	if !ok {
		return
	}
	defer done()
	// Another account's sandbox is not_found before the body is judged.
	if req.Port < 1 || req.Port > 65535 {
		writeErr(w, sandbox.Invalid("port", fmt.Sprintf("port %d is not 1 to 65535", req.Port)))
		return
	}
	ttl := DefaultPreviewTTL
	if req.TTLSeconds != 0 {
		ttl = time.Duration(req.TTLSeconds) * time.Second
	}
	if ttl < time.Second || ttl > MaxPreviewTTL {
		writeErr(w, sandbox.Invalid("ttl_seconds", fmt.Sprintf("ttl_seconds %d is not 1 to %d", req.TTLSeconds, int(MaxPreviewTTL/time.Second))))
		return
	}
	pp, ok := p.(PortPublisher)
	if !ok {
		writeErr(w, fmt.Errorf("provider %s gives its sandboxes no address this platform can reach: %w", rec.Provider, sandbox.ErrUnsupported))
		return
	}
	ports, err := pp.PublishedPorts(r.Context(), handleOf(rec))
	if err != nil {
		writeErr(w, err)
		return
	}
	found := false
	for _, pt := range ports {
		found = found || pt == req.Port
	}
	if !found {
		writeErr(w, sandbox.Invalid("port", fmt.Sprintf("sandbox %s does not publish port %d (it publishes %v)", rec.Name, req.Port, ports)))
		return
	}
	created := rec.CreatedAt.UnixNano()
	label := s.previewLabel(rec.AccountID, rec.Name, created, req.Port)
	origin, err := s.previewOrigin(r, label)
	if err != nil {
		writeErr(w, err)
		return
	}
	now := s.cfg.Now()
	exp := now.Add(ttl).Truncate(time.Second)
	var idb [12]byte
	_, _ = rand.Read(idb[:])
	id := "pl_" + hex.EncodeToString(idb[:])
	if err := s.cfg.Store.AddPreviewLink(r.Context(), store.PreviewLink{ID: id, AccountID: rec.AccountID, Sandbox: rec.Name, ProviderName: rec.ProviderName,
		Port: req.Port, CreatedAt: now.UTC(), ExpiresAt: exp.UTC()}); err != nil {
		writeErr(w, err)
		return
	}
	tok := s.signPreview(previewClaims{Kind: "link", Account: rec.AccountID, Name: rec.Name, Created: created, Port: req.Port, KeyID: k.ID, Exp: exp.Unix(), Link: id})
	writeJSON(w, http.StatusOK, PreviewURL{ID: id, URL: origin + PreviewExchangePath + "?token=" + url.QueryEscape(tok), Origin: origin, ExpiresAt: exp.UTC()})
}

// previewList is GET /v1/sandboxes/{name}/previews: the links made for
// the sandbox (the one of the name now), oldest first, revoked and
// expired ones included.
func (s *Server) previewList(w http.ResponseWriter, r *http.Request, k store.Key) {
	rec, err := s.record(r.Context(), k, r.PathValue("name"))
	if err != nil {
		writeErr(w, err)
		return
	}
	links, err := s.cfg.Store.ListPreviewLinks(r.Context(), rec.AccountID, rec.Name, rec.ProviderName)
	if err != nil {
		writeErr(w, err)
		return
	}
	out := make([]PreviewLink, 0, len(links))
	for _, l := range links {
		origin, err := s.previewOrigin(r, s.previewLabel(rec.AccountID, rec.Name, rec.CreatedAt.UnixNano(), l.Port))
		if err != nil {
			writeErr(w, err)
			return
		}
		v := PreviewLink{ID: l.ID, Port: l.Port, Origin: origin, CreatedAt: l.CreatedAt, ExpiresAt: l.ExpiresAt}
		if !l.RevokedAt.IsZero() {
			t := l.RevokedAt
			v.RevokedAt = &t
		}
		out = append(out, v)
	}
	writeJSON(w, http.StatusOK, map[string][]PreviewLink{"data": out})
}

// previewRevoke is DELETE /v1/sandboxes/{name}/previews/{id}: the link
// and every cookie it was exchanged for are refused from now on (204;
// 404 for a link the account's sandbox does not have).
func (s *Server) previewRevoke(w http.ResponseWriter, r *http.Request, k store.Key) {
	rec, err := s.record(r.Context(), k, r.PathValue("name"))
	if err != nil {
		writeErr(w, err)
		return
	}
	if err := s.cfg.Store.RevokePreviewLink(r.Context(), rec.AccountID, rec.Name, r.PathValue("id"), s.cfg.Now().UTC()); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func previewRefused(w http.ResponseWriter) {
	w.Header().Set("Cache-Control", "no-store")
	writeErr(w, &apiError{http.StatusUnauthorized, &Error{Kind: KindUnauthorized, Reason: "preview", Message: errPreview.Error()}})
}

// previewAuthorize checks that claims' key is valid and the account's,
// and that the sandbox they name is the one of that name now.
func (s *Server) previewAuthorize(r *http.Request, c previewClaims) (store.Key, bool) {
	k, err := s.cfg.Store.KeyByID(r.Context(), c.KeyID)
	if err != nil || !k.RevokedAt.IsZero() || k.AccountID != c.Account {
		return store.Key{}, false
	}
	rec, err := s.cfg.Store.GetSandbox(r.Context(), c.Account, c.Name)
	if err != nil || rec.CreatedAt.UnixNano() != c.Created {
		return store.Key{}, false
	}
	l, err := s.cfg.Store.PreviewLinkByID(r.Context(), c.Link)
	if err != nil || !l.RevokedAt.IsZero() || l.AccountID != c.Account || l.Sandbox != c.Name || l.ProviderName != rec.ProviderName || l.Port != c.Port {
		return store.Key{}, false
	}
	return k, true
}

// servePreview serves a request to a preview's origin.
func (s *Server) servePreview(w http.ResponseWriter, r *http.Request, label string) {
	w.Header().Set("Referrer-Policy", "no-referrer")
	addr := sourceOf(r)
	if d, ok := s.mayAuthenticate(addr); !ok {
		w.Header().Set("Retry-After", RetryAfterHeader(d))
		writeErr(w, &apiError{http.StatusTooManyRequests, &Error{Kind: "rate_limited", Reason: "failed_auth",
			Message: "too many failed authentications from this address", RetryAfterMS: max(d.Milliseconds(), 1)}})
		return
	}
	secure := r.TLS != nil || strings.HasPrefix(s.baseURL(r), "https://")
	if r.URL.Path == PreviewExchangePath {
		c, err := s.verifyPreview(r.URL.Query().Get("token"), "link", label)
		if err != nil {
			s.authFailed(addr)
			previewRefused(w)
			return
		}
		if _, ok := s.previewAuthorize(r, c); !ok {
			s.authFailed(addr)
			previewRefused(w)
			return
		}
		exp := max(s.cfg.Now().Add(PreviewCookieTTL).Unix(), c.Exp)
		cookie := s.signPreview(previewClaims{Kind: "cookie", Account: c.Account, Name: c.Name, Created: c.Created, Port: c.Port, KeyID: c.KeyID, Exp: exp, Link: c.Link})
		http.SetCookie(w, &http.Cookie{Name: PreviewCookie, Value: cookie, Path: "/", Expires: time.Unix(exp, 0), HttpOnly: true, Secure: secure, SameSite: http.SameSiteLaxMode})
		w.Header().Set("Cache-Control", "no-store")
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	ck, err := r.Cookie(PreviewCookie)
	if err != nil {
		s.authFailed(addr)
		previewRefused(w)
		return
	}
	c, err := s.verifyPreview(ck.Value, "cookie", label)
	if err != nil {
		s.authFailed(addr)
		previewRefused(w)
		return
	}
	k, ok := s.previewAuthorize(r, c)
	if !ok {
		s.authFailed(addr)
		previewRefused(w)
		return
	}
	if d, ok := s.allow(k.ID); !ok {
		w.Header().Set("Retry-After", RetryAfterHeader(d))
		writeErr(w, &apiError{http.StatusTooManyRequests, &Error{Kind: "rate_limited", Reason: "api_key",
			Message: "this API key is over its rate", RetryAfterMS: max(d.Milliseconds(), 1)}})
		return
	}
	if r.ContentLength > s.cfg.ProxyMaxBody {
		writeErr(w, tooLarge(fmt.Errorf("%d bytes, the proxy takes at most %d", r.ContentLength, s.cfg.ProxyMaxBody)))
		return
	}
	rec, p, err := s.use(r.Context(), k, c.Name)
	if err != nil {
		writeErr(w, err)
		return
	}
	done := s.busy(rec)
	defer done()
	s.proxyRecord(w, r, rec, p, c.Port, "", r.URL.EscapedPath())
}

// withoutCookie is the Cookie header h without the cookie named name.
func withoutCookie(h http.Header, name string) {
	vals := h.Values("Cookie")
	if len(vals) == 0 {
		return
	}
	var keep []string
	for _, v := range vals {
		for _, part := range strings.Split(v, ";") {
			part = strings.TrimSpace(part)
			if n, _, _ := strings.Cut(part, "="); part != "" && n != name {
				keep = append(keep, part)
			}
		}
	}
	h.Del("Cookie")
	if len(keep) > 0 {
		h.Set("Cookie", strings.Join(keep, "; "))
	}
}

// WithPreviews is next with the requests to a preview's host name
// served by s (servePreview): a handler that mounts s under /v1/ only
// wraps itself in it so previews, served at /, reach s.
func (s *Server) WithPreviews(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if label := s.previewLabelOf(r); label != "" {
			s.servePreview(w, r, label)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// PublishedPort is one entry of GET /v1/sandboxes/{name}/ports.
type PublishedPort struct {
	Port int    `json:"port"`
	URL  string `json:"url"` // the API's proxy of it (with the key); a browser asks for a preview link
}

// ports is GET /v1/sandboxes/{name}/ports: the ports the sandbox
// publishes, in order; none for a provider that publishes none.
func (s *Server) ports(w http.ResponseWriter, r *http.Request, k store.Key) {
	rec, err := s.record(r.Context(), k, r.PathValue("name"))
	if err != nil {
		writeErr(w, err)
		return
	}
	p, err := s.ProviderFor(rec.AccountID, rec.Provider)
	if err != nil {
		writeErr(w, err)
		return
	}
	out := []PublishedPort{}
	if pp, ok := p.(PortPublisher); ok {
		ports, err := pp.PublishedPorts(r.Context(), handleOf(rec))
		if err != nil {
			writeErr(w, err)
			return
		}
		for _, pt := range ports {
			out = append(out, PublishedPort{Port: pt, URL: PortURL(s.baseURL(r), rec.Name, pt)})
		}
	}
	writeJSON(w, http.StatusOK, map[string][]PublishedPort{"data": out})
}
