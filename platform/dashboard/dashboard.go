// Package dashboard is the platform's web dashboard, served by `managoat
// serve` at /: plain HTML, CSS and JavaScript embedded in the binary (no
// build step), over the platform's own /v1 API.
//
//	d, err := dashboard.New(dashboard.Config{API: srv, Store: st, Secret: secret})
//	mux.Handle("/", d)
//
// Signing in: the user gives an API key (POST /ui/login); it is checked
// against the store and kept in a cookie, managoat_session: HttpOnly (no
// script reads it), SameSite=Strict (no other site's page sends it),
// Secure when the request came over TLS, Path=/. The page's scripts never
// hold the key: they call the API at /ui/v1/..., which the dashboard
// forwards to /v1/... in process with the cookie's key as the Bearer
// header (the Cookie header itself is not forwarded), so every answer,
// error bodies included, is the API's own.
//
// CSRF: every state-changing request (any method but GET and HEAD; the
// stream's WebSocket too, a GET) must carry the session's token (the
// X-CSRF-Token header, or csrf= in the query for a WebSocket), an HMAC of
// the key under Secret, which only a page of this origin can learn
// (GET /ui/session), and an Origin header, when the browser sends one
// (it does on every POST and WebSocket), naming this very origin; a
// sign-in needs the Origin check too (no login CSRF). A refusal is 403
// denied{csrf} in the API's error body. Pages are served with a
// Content-Security-Policy of scripts of this origin only and no framing.
//
// Previews (a published port opened in the browser) are never served on
// this origin: they have origins of their own (platform/api preview.go),
// so an application's scripts cannot read the dashboard or use its
// cookie.
//
// The terminal is xterm.js, vendored in static/vendor at the version its
// README names, with its fit add-on.
package dashboard

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/store"
)

//go:embed static
var static embed.FS

// SessionCookie is the name of the cookie that holds the signed-in key.
const SessionCookie = "managoat_session"

// Config configures the dashboard.
type Config struct {
	API    http.Handler // the /v1 API (an *api.Server); required
	Store  store.Store  // checks a key at sign-in; required
	Secret []byte       // keys the CSRF tokens; required, at least 16 bytes
	Logger *slog.Logger
}

// Handler serves the dashboard.
type Handler struct {
	cfg    Config
	mux    *http.ServeMux
	static http.Handler
}

// New returns the dashboard.
func New(cfg Config) (*Handler, error) {
	if cfg.API == nil || cfg.Store == nil || len(cfg.Secret) < 16 {
		return nil, errors.New("dashboard: API, Store and a Secret of 16 bytes or more are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	sub, err := fs.Sub(static, "static")
	if err != nil {
		return nil, err
	}
	h := &Handler{cfg: cfg, mux: http.NewServeMux(), static: http.FileServerFS(sub)}
	h.mux.HandleFunc("GET /{$}", h.index)
	h.mux.Handle("GET /static/", http.StripPrefix("/static/", h.static))
	h.mux.HandleFunc("POST /ui/login", h.login)
	h.mux.HandleFunc("POST /ui/logout", h.logout)
	h.mux.HandleFunc("GET /ui/session", h.session)
	h.mux.HandleFunc("/ui/v1/", h.bridge)
	h.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeErr(w, http.StatusNotFound, "not_found", "route", "no such page: "+r.URL.Path)
	})
	return h, nil
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Referrer-Policy", "same-origin")
	// xterm.js sets styles of its own (a <style> element): styles may be
	// inline, scripts may not.
	hd.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	h.mux.ServeHTTP(w, r)
}

func (h *Handler) index(w http.ResponseWriter, r *http.Request) {
	b, err := static.ReadFile("static/index.html")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	_, _ = w.Write(b)
}

// errorBody is the API's error body.
type errorBody struct {
	Error api.Error `json:"error"`
}

func writeErr(w http.ResponseWriter, status int, kind, reason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(errorBody{api.Error{Kind: kind, Reason: reason, Message: msg}})
}

func secure(r *http.Request) bool { return r.TLS != nil }

// sameOrigin reports whether the request's Origin (if it sent one; a
// browser does on every POST, and on a WebSocket) is this origin.
func sameOrigin(r *http.Request, required bool) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return !required && r.Header.Get("Sec-Fetch-Site") != "cross-site"
	}
	u, err := url.Parse(o)
	if err != nil {
		return false
	}
	scheme := "http"
	if secure(r) {
		scheme = "https"
	}
	return u.Scheme == scheme && strings.EqualFold(u.Host, r.Host)
}

// csrfToken is the session's CSRF token.
func (h *Handler) csrfToken(key string) string {
	m := hmac.New(sha256.New, h.cfg.Secret)
	m.Write([]byte("managoat dashboard csrf\x00" + key))
	return hex.EncodeToString(m.Sum(nil))
}

func (h *Handler) checkCSRF(r *http.Request, key, tok string) bool {
	return tok != "" && hmac.Equal([]byte(tok), []byte(h.csrfToken(key))) && sameOrigin(r, false)
}

func sessionKey(r *http.Request) string {
	c, err := r.Cookie(SessionCookie)
	if err != nil || len(c.Value) > 512 {
		return ""
	}
	return c.Value
}

// maxLogin bounds a sign-in's body.
const maxLogin = 4 << 10

func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	if !sameOrigin(r, true) {
		writeErr(w, http.StatusForbidden, "denied", "csrf", "sign-in from another origin refused")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxLogin)
	var req struct {
		Key string `json:"key"`
	}
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeErr(w, http.StatusBadRequest, "invalid", "json", "the body must be {\"key\": \"mgk_...\"}")
			return
		}
	} else {
		if err := r.ParseForm(); err != nil {
			writeErr(w, http.StatusBadRequest, "invalid", "form", "the form could not be read")
			return
		}
		req.Key = r.PostForm.Get("key")
	}
	key := strings.TrimSpace(req.Key)
	k, err := api.Authenticate(r.Context(), h.cfg.Store, key)
	if err != nil {
		if errors.Is(err, api.ErrBadKey) {
			writeErr(w, http.StatusUnauthorized, api.KindUnauthorized, "", api.ErrBadKey.Error())
			return
		}
		writeErr(w, http.StatusServiceUnavailable, "unavailable", "store", "the platform's records cannot be read now")
		return
	}
	http.SetCookie(w, &http.Cookie{Name: SessionCookie, Value: key, Path: "/", HttpOnly: true, Secure: secure(r),
		SameSite: http.SameSiteStrictMode, MaxAge: int((12 * time.Hour).Seconds())})
	h.writeSession(w, r.Context(), k, key)
}

func (h *Handler) writeSession(w http.ResponseWriter, ctx context.Context, k store.Key, key string) {
	name := ""
	if a, err := h.cfg.Store.AccountByID(ctx, k.AccountID); err == nil {
		name = a.Name
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(map[string]string{"account": name, "key_id": k.ID, "csrf": h.csrfToken(key)})
}

func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	if !h.checkCSRF(r, sessionKey(r), r.Header.Get("X-CSRF-Token")) {
		writeErr(w, http.StatusForbidden, "denied", "csrf", "missing or wrong CSRF token, or another origin")
		return
	}
	http.SetCookie(w, &http.Cookie{Name: SessionCookie, Value: "", Path: "/", HttpOnly: true, Secure: secure(r), SameSite: http.SameSiteStrictMode, MaxAge: -1})
	w.WriteHeader(http.StatusNoContent)
}

func (h *Handler) session(w http.ResponseWriter, r *http.Request) {
	key := sessionKey(r)
	k, err := api.Authenticate(r.Context(), h.cfg.Store, key)
	if err != nil {
		writeErr(w, http.StatusUnauthorized, api.KindUnauthorized, "", "not signed in")
		return
	}
	h.writeSession(w, r.Context(), k, key)
}

// bridge forwards /ui/v1/... to the API's /v1/... with the session's key.
func (h *Handler) bridge(w http.ResponseWriter, r *http.Request) {
	key := sessionKey(r)
	if key == "" {
		writeErr(w, http.StatusUnauthorized, api.KindUnauthorized, "", "not signed in")
		return
	}
	ws := strings.Contains(strings.ToLower(r.Header.Get("Upgrade")), "websocket")
	if r.Method != http.MethodGet && r.Method != http.MethodHead || ws {
		tok := r.Header.Get("X-CSRF-Token")
		if ws {
			tok = r.URL.Query().Get("csrf")
			if !sameOrigin(r, true) {
				tok = ""
			}
		}
		if !h.checkCSRF(r, key, tok) {
			writeErr(w, http.StatusForbidden, "denied", "csrf", "missing or wrong CSRF token, or another origin")
			return
		}
	}
	r2 := r.Clone(r.Context())
	r2.URL.Path = strings.TrimPrefix(r.URL.Path, "/ui")
	if r.URL.RawPath != "" {
		r2.URL.RawPath = strings.TrimPrefix(r.URL.RawPath, "/ui")
	}
	q := r2.URL.Query()
	if q.Has("csrf") {
		q.Del("csrf")
		r2.URL.RawQuery = q.Encode()
	}
	r2.RequestURI = r2.URL.RequestURI()
	r2.Header.Del("Cookie")
	r2.Header.Set("Authorization", "Bearer "+key)
	w.Header().Set("Cache-Control", "no-store")
	h.cfg.API.ServeHTTP(w, r2)
}
