package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/managoat/managoat/platform/policy"
	"github.com/managoat/managoat/platform/store"
	runnerprov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/sandbox"
)

// providerName mints a sandbox's name on its provider.
func (s *Server) providerName(ctx context.Context, accountID string, p sandbox.Provider) (string, error) {
	if rp, ok := p.(*runnerprov.Provider); ok {
		return rp.Mint(ctx) // Create places runner sandboxes itself (fleet.go); this is the policy's first for a create asking nothing
	}
	var b [10]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return NamePrefix + hex.EncodeToString(b[:]), nil
}

func handleOf(rec store.Sandbox) *sandbox.Handle {
	h := sandbox.BuildHandle(rec.Provider, rec.ProviderName)
	h.InstanceID = rec.InstanceID
	return h
}

func recKey(accountID, name string) string { return accountID + "\x00" + name }

// recLock is the lock of one record, kept while anyone holds or awaits it.
type recLock struct {
	mu   sync.Mutex
	refs int // holders and waiters, under Server.mu
}

// lock serialises the state changes of one record in this process (a
// wake and a park of one sandbox must not interleave); the store's
// compare-and-set covers other replicas. The lock goes with its last
// holder, so a serve keeps none for the sandboxes it no longer touches.
func (s *Server) lock(accountID, name string) func() {
	k := recKey(accountID, name)
	s.mu.Lock()
	l := s.locks[k]
	if l == nil {
		l = &recLock{}
		s.locks[k] = l
	}
	l.refs++
	s.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		s.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(s.locks, k)
		}
		s.mu.Unlock()
	}
}

// view is the API's form of a record.
func view(rec store.Sandbox) Sandbox {
	v := Sandbox{Name: rec.Name, Provider: rec.Provider, State: rec.State, URL: rec.URL, InstanceID: rec.InstanceID,
		Limits: FromLimits(rec.Limits), CreatedAt: rec.CreatedAt, LastActivity: rec.LastActivity, ParkedBy: rec.ParkedBy,
		Image: rec.Image, Labels: rec.Labels}
	if !rec.ParkedAt.IsZero() {
		t := rec.ParkedAt
		v.ParkedAt = &t
	}
	return v
}

// record loads the account's record of name: ErrNotFound for a name the
// account does not have, whoever else has it.
func (s *Server) record(ctx context.Context, k store.Key, name string) (store.Sandbox, error) {
	if err := sandbox.ValidateName(name); err != nil {
		return store.Sandbox{}, fieldErr("name", err)
	}
	return s.cfg.Store.GetSandbox(ctx, k.AccountID, name)
}

// minTouchedSweep is the number of activity marks kept before the first
// sweep of those older than a second.
const minTouchedSweep = 512

// activity marks use of a record now in the store; it is written at most
// once a second per record. A write is skipped only when one of this
// process has been made (not merely begun) within the second, so the
// store's mark is then at most a second old: a park, which re-reads the
// record after claiming it (Park), cannot miss a use that marked
// activity before reading the record (use).
func (s *Server) activity(accountID, name string) {
	now := s.cfg.Now()
	key := recKey(accountID, name)
	s.mu.Lock()
	last, ok := s.touched[key]
	s.mu.Unlock()
	if ok && now.Sub(last) < time.Second && !now.Before(last) {
		return
	}
	if err := s.cfg.Store.TouchSandbox(context.WithoutCancel(context.Background()), accountID, name, now.UTC()); err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.After(s.touched[key]) {
		s.touched[key] = now
	}
	if len(s.touched) > s.touchedSweep {
		// A mark older than a second thins nothing: sweep them, at most
		// once per doubling of the marks (amortised constant time).
		for k, t := range s.touched {
			if now.Sub(t) >= time.Second {
				delete(s.touched, k)
			}
		}
		s.touchedSweep = max(minTouchedSweep, 2*len(s.touched))
	}
}

// busy counts a call in flight on the record as activity until it ends
// (an hour-long exec is not idle), and marks the activity at its end.
func (s *Server) busy(rec store.Sandbox) func() {
	key := recKey(rec.AccountID, rec.Name)
	s.mu.Lock()
	s.active[key]++
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		if s.active[key]--; s.active[key] <= 0 {
			delete(s.active, key)
		}
		s.mu.Unlock()
		s.activity(rec.AccountID, rec.Name)
	}
}

// Active reports whether the record has a call in flight or an open
// stream (an attached client or a running spawn) in this process.
func (s *Server) Active(accountID, name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.active[recKey(accountID, name)] > 0
}

// take is a handler's use of the sandbox its path names, marked busy
// until done; ok false: the error is written.
func (s *Server) take(w http.ResponseWriter, r *http.Request, k store.Key) (rec store.Sandbox, p sandbox.Provider, done func(), ok bool) {
	rec, p, err := s.use(r.Context(), k, r.PathValue("name"))
	if err != nil {
		writeErr(w, err)
		return rec, nil, nil, false
	}
	return rec, p, s.busy(rec), true
}

// use loads a record for an operation on it, its activity recorded, woken
// first when parked or being parked.
//
// The activity is marked before the record is read: a park claims the
// record (state parking) and then reads it again (Park), so either the
// park sees this mark and gives up, or this read sees its claim, waits
// for the park to end and wakes the sandbox. Read first and marked after,
// a call could start between a park's check and its suspend, on any
// replica, and run on a sandbox being parked.
func (s *Server) use(ctx context.Context, k store.Key, name string) (store.Sandbox, sandbox.Provider, error) {
	if err := sandbox.ValidateName(name); err != nil {
		return store.Sandbox{}, nil, fieldErr("name", err)
	}
	s.activity(k.AccountID, name)
	rec, err := s.record(ctx, k, name)
	if err != nil {
		return rec, nil, err
	}
	p, err := s.ProviderFor(rec.AccountID, rec.Provider)
	if err != nil {
		return rec, nil, err
	}
	if rec.State == store.StateParked || rec.State == store.StateParking {
		if rec, err = s.Wake(ctx, rec); err != nil {
			return rec, nil, err
		}
	}
	return rec, p, nil
}

// ParkingStale is how long a park's claim (state parking) may last: a
// use waits for a park at most this long from its claim, a park's
// provider call is bounded by half of it, and a claim older than it is
// a dead park's, which lifecycle settles from the provider's state.
const ParkingStale = 2 * time.Minute

// parked reads the record again, waiting while a park has it (state
// parking), at most until its claim is ParkingStale old: then
// Unavailable{parking}.
func (s *Server) parked(ctx context.Context, accountID, name string) (store.Sandbox, error) {
	for {
		rec, err := s.cfg.Store.GetSandbox(ctx, accountID, name)
		if err != nil || rec.State != store.StateParking {
			return rec, err
		}
		if s.cfg.Now().Sub(rec.ParkedAt) >= ParkingStale {
			return rec, sandbox.Unavailable("parking", fmt.Errorf("sandbox %q is being parked since %s", name, rec.ParkedAt.Format(time.RFC3339)))
		}
		select {
		case <-ctx.Done():
			return rec, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Wake brings a parked sandbox back on the provider that made it: Resume
// where it was suspended, a fresh Create of the same provider name where it
// was destroyed for idleness. A park under way (here or on another
// replica) is waited for first. It is a no-op for a record not parked.
func (s *Server) Wake(ctx context.Context, rec store.Sandbox) (store.Sandbox, error) {
	defer s.lock(rec.AccountID, rec.Name)()
	rec, err := s.parked(ctx, rec.AccountID, rec.Name)
	if err != nil || rec.State != store.StateParked {
		return rec, err
	}
	p, err := s.ProviderFor(rec.AccountID, rec.Provider)
	if err != nil {
		return rec, err
	}
	reg := sandbox.NewRegistry(p)
	h := handleOf(rec)
	switch rec.ParkedBy {
	case store.ParkDestroy:
		if err := s.wakeFits(ctx, rec, p); err != nil { // fleet.go: the runner's room
			return rec, err
		}
		nh, err := reg.Create(ctx, rec.Provider, rec.ProviderName, recreateOptions(rec, rec.Limits))
		if err != nil {
			return rec, err
		}
		rec.InstanceID, h = nh.InstanceID, nh
	default:
		if _, err := reg.Resume(ctx, h); err != nil {
			return rec, err
		}
	}
	return s.woken(ctx, rec, p, h)
}

// woken records a wake's outcome: the record running. Another replica
// that woke the sandbox meanwhile (or a pass that found it running) wrote
// the record first: its record is the outcome; one that woke it and a
// new park since leave the new park standing (Unavailable{parked}: the
// next call wakes it). A record destroyed
// meanwhile (its user's destroy, any replica) is not found, and what this
// wake created is destroyed again: it has no record, and a runner's
// sandbox is never reaped as an orphan.
func (s *Server) woken(ctx context.Context, rec store.Sandbox, p sandbox.Provider, h *sandbox.Handle) (store.Sandbox, error) {
	by, inst := rec.ParkedBy, rec.InstanceID
	for attempt := 0; ; attempt++ {
		next := rec
		next.InstanceID = inst
		next.State, next.ParkedAt, next.ParkedBy, next.LastActivity = store.StateRunning, time.Time{}, "", s.cfg.Now().UTC()
		out, err := s.cfg.Store.UpdateSandbox(ctx, next)
		if errors.Is(err, store.ErrConflict) && attempt < 3 {
			cur, gerr := s.cfg.Store.GetSandbox(ctx, rec.AccountID, rec.Name)
			switch {
			case errors.Is(gerr, store.ErrNotFound):
				err = gerr
			case gerr != nil:
				return rec, gerr
			case cur.ProviderName != rec.ProviderName:
				return cur, fmt.Errorf("sandbox %q was replaced while it woke: %w", rec.Name, store.ErrNotFound)
			case cur.State != store.StateParked:
				return cur, nil // woken (or changed) by someone else: theirs is the outcome
			case !cur.ParkedAt.Equal(rec.ParkedAt) || cur.ParkedBy != rec.ParkedBy:
				// Woken by another and parked again since this wake's
				// provider call: whether that came before or after the
				// park is unknown, so the park's record stands.
				return cur, sandbox.Unavailable("parked", fmt.Errorf("sandbox %q was parked again while this call woke it; try again", rec.Name))
			default:
				rec = cur // the same park (another field changed): write again
				continue
			}
		}
		if errors.Is(err, store.ErrNotFound) && by == store.ParkDestroy {
			s.unrecorded(ctx, p, h, rec)
		}
		return out, err
	}
}

// setState records a state its user's call gave the record's sandbox
// (suspended, running), over changes made meanwhile to the same sandbox's
// record, never over another sandbox's record of the name.
func (s *Server) setState(ctx context.Context, rec store.Sandbox, state string) {
	for range 3 {
		rec.State = state
		if state != store.StateParked {
			rec.ParkedAt, rec.ParkedBy = time.Time{}, ""
		}
		if _, err := s.cfg.Store.UpdateSandbox(ctx, rec); !errors.Is(err, store.ErrConflict) {
			return
		}
		cur, err := s.cfg.Store.GetSandbox(ctx, rec.AccountID, rec.Name)
		if err != nil || cur.ProviderName != rec.ProviderName {
			return // gone, or another sandbox of the name since: not this call's to say
		}
		rec = cur
	}
}

func (s *Server) create(w http.ResponseWriter, r *http.Request, k store.Key) {
	var req CreateRequest
	if err := s.decode(w, r, &req); err != nil {
		writeErr(w, err)
		return
	}
	if err := sandbox.ValidateName(req.Name); err != nil {
		writeErr(w, fieldErr("name", err))
		return
	}
	if req.TimeoutMS < 0 {
		writeErr(w, badJSON("timeout_ms", "timeout_ms is negative"))
		return
	}
	if err := req.Limits.validate(); err != nil {
		writeErr(w, err)
		return
	}
	lim := req.Limits.ToSandbox()
	if err := lim.Validate(); err != nil {
		writeErr(w, fieldErr("limits", err))
		return
	}
	if err := validateImage(req.Image); err != nil {
		writeErr(w, err)
		return
	}
	if err := ValidateLabels(req.Labels); err != nil {
		writeErr(w, err)
		return
	}
	if req.Image != "" && req.CreateNew {
		writeErr(w, fieldErr("image", sandbox.Invalid("image", "create_new takes no image: create the sandbox without create_new")))
		return
	}
	for _, port := range req.Publish {
		if port < 1 || port > 65535 {
			writeErr(w, badJSON("publish", fmt.Sprintf("publish: port %d is not 1 to 65535", port)))
			return
		}
	}
	ctx := context.WithValue(r.Context(), baseKey{}, s.baseURL(r))
	if req.RunnerSelector != "" || req.PreferLastRunner {
		sel, err := parseSelector(req.RunnerSelector)
		if err != nil {
			writeErr(w, err)
			return
		}
		ctx = WithPlacement(ctx, Placement{Selector: sel, PreferLast: req.PreferLastRunner}) // fleet.go
	}
	ctx = context.WithValue(ctx, recordKey{}, recordAsk{image: req.Image, labels: req.Labels})
	rec, created, err := s.Create(ctx, k.AccountID, req.Name, req.Provider, lim, req.Publish, req.CreateNew, time.Duration(req.TimeoutMS)*time.Millisecond)
	if err != nil {
		writeErr(w, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, view(rec))
}

// recordKey carries a create request's image and labels (recordAsk) to
// Create; a Create without them (an adoption's retry) asks for neither.
type recordKey struct{}

type recordAsk struct {
	image  string
	labels map[string]string
}

func askOf(ctx context.Context) recordAsk {
	a, _ := ctx.Value(recordKey{}).(recordAsk)
	return a
}

// runsImages reports whether p runs a create's image: provider/local
// does, and so does a provider with a RunsImages method saying so (the
// others choose their own, and are refused one rather than drop it).
func runsImages(p sandbox.Provider) bool {
	if r, ok := p.(interface{ RunsImages() bool }); ok {
		return r.RunsImages()
	}
	return p.Name() == "local"
}

// recreateOptions are the options a sandbox of the record is created
// with again (a wake from a park by destroy, an adoption): its image.
func recreateOptions(rec store.Sandbox, lim sandbox.Limits) sandbox.CreateOptions {
	return sandbox.CreateOptions{Limits: lim, Image: rec.Image}
}

// Create makes (or, unless createNew, adopts) the account's sandbox name.
// It reports whether it made a new record. Publish are ports to publish,
// on a provider that publishes (a PortPublisher); the record's URL is
// then the platform's proxy of the first, under the base URL ctx carries.
func (s *Server) Create(ctx context.Context, accountID, name, pin string, lim sandbox.Limits, publish []int, createNew bool, timeout time.Duration) (store.Sandbox, bool, error) {
	for attempt := 0; ; attempt++ {
		rec, err := s.cfg.Store.GetSandbox(ctx, accountID, name)
		switch {
		case err == nil:
			if createNew {
				return rec, false, fmt.Errorf("sandbox %q exists: %w", name, sandbox.ErrAlreadyExists)
			}
			if pin != "" && pin != rec.Provider {
				return rec, false, fmt.Errorf("sandbox %q lives on provider %q, not %q: %w", name, rec.Provider, pin, sandbox.ErrAlreadyExists)
			}
			// An adoption is a use: marked before the record is read
			// again, as use does, so a park under way is seen (waited
			// for, the sandbox woken) or gives up.
			s.activity(accountID, name)
			if rec, err = s.cfg.Store.GetSandbox(ctx, accountID, name); errors.Is(err, store.ErrNotFound) && attempt < 3 {
				continue
			} else if err != nil {
				return rec, false, err
			}
			return s.adopt(ctx, rec, lim)
		case !errors.Is(err, store.ErrNotFound):
			return rec, false, err
		}
		prov, err := s.cfg.Policy.Choose(pin)
		if err != nil {
			return rec, false, err
		}
		p, err := s.ProviderFor(accountID, prov)
		if err != nil {
			return rec, false, err
		}
		if createNew && !p.Capabilities().Has(sandbox.CapCreateNew) {
			return rec, false, sandbox.ErrNotSupported
		}
		if err := checkPublish(p, prov, publish, createNew); err != nil {
			return rec, false, err
		}
		ask := askOf(ctx)
		if ask.image != "" && !runsImages(p) {
			return rec, false, fieldErr("image", sandbox.Invalid("image", fmt.Sprintf("image: provider %s chooses its own images; an image is the local provider's", prov)))
		}
		now := s.cfg.Now().UTC()
		rec = store.Sandbox{AccountID: accountID, Name: name, Provider: prov, State: store.StateCreating,
			Limits: lim, CreatedAt: now, LastActivity: now, Image: ask.image, Labels: ask.labels}
		if rp, ok := p.(*runnerprov.Provider); ok {
			rec, err = s.insertPlaced(ctx, rec, rp) // fleet.go: placed by capacity and labels
		} else if pl := placementOf(ctx); len(pl.Selector) > 0 || pl.PreferLast {
			return rec, false, sandbox.Invalid("runner_selector", "runner_selector and prefer_last_runner place sandboxes of the runner provider, not "+prov)
		} else if rec.ProviderName, err = s.providerName(ctx, accountID, p); err == nil {
			err = s.insertCounted(ctx, rec)
		}
		pname := rec.ProviderName
		if errors.Is(err, store.ErrAlreadyExists) && attempt < 3 {
			continue // another create of this name won: adopt its record, or refuse for create_new
		}
		if err != nil {
			return rec, false, err
		}
		rec.Version = 1
		reg := sandbox.NewRegistry(p)
		var h *sandbox.Handle
		if createNew {
			id, ierr := s.intent(ctx, store.Intent{AccountID: accountID, Name: name, Op: store.OpCreateNew, Provider: prov, ProviderName: pname})
			if ierr != nil {
				// No intent, no bounded write: nothing was asked of the
				// provider, so the record goes and the name is free again.
				_ = s.cfg.Store.DeleteSandboxIf(context.WithoutCancel(ctx), store.Sandbox{AccountID: accountID, Name: name, ProviderName: pname})
				return rec, false, ierr
			}
			h, err = reg.CreateNew(ctx, prov, pname, sandbox.CreateNewOptions{Timeout: timeout})
			s.outcome(ctx, id, err)
			if err != nil && sandbox.Transient(err) {
				// Uncertain: the record stays "creating" for the
				// reconciler, which asks the provider, never creates again.
				return rec, false, err
			}
		} else {
			h, err = reg.Create(ctx, prov, pname, sandbox.CreateOptions{Limits: lim, Publish: publish, Image: ask.image})
		}
		if err != nil {
			// The provider may hold a sandbox of pname (a create cut short):
			// the reaper destroys such an orphan after its grace period.
			// Only its own record: the name may have been destroyed and
			// made again meanwhile (another replica).
			_ = s.cfg.Store.DeleteSandboxIf(context.WithoutCancel(ctx), store.Sandbox{AccountID: accountID, Name: name, ProviderName: pname})
			return rec, false, err
		}
		rec, err = s.finish(ctx, rec, p, h, store.StateRunning)
		if errors.Is(err, store.ErrNotFound) {
			s.unrecorded(ctx, p, h, rec)
		}
		return rec, true, err
	}
}

// insertCounted inserts a new sandbox's record if the account holds
// fewer than MaxSandboxesPerAccount: the count and the insert are made
// under the account's lock, so this process's creates are counted one at
// a time.
func (s *Server) insertCounted(ctx context.Context, rec store.Sandbox) error {
	defer s.lock(rec.AccountID, "")() // "" is no sandbox's name
	// underQuota (fleet.go) counts the records, never lists them.
	if err := s.underQuota(ctx, rec.AccountID); err != nil {
		return err
	}
	return s.cfg.Store.InsertSandbox(ctx, rec)
}

// unrecorded destroys a sandbox that a create or a wake made while its
// record was destroyed (its user's destroy, any replica): nothing would
// ever reach it again, and a runner's sandbox is never reaped as an
// orphan. Best effort, bounded by ParkingStale/2; a failure is logged.
func (s *Server) unrecorded(ctx context.Context, p sandbox.Provider, h *sandbox.Handle, rec store.Sandbox) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ParkingStale/2)
	defer cancel()
	if err := sandbox.NewRegistry(p).Destroy(dctx, h); err != nil {
		s.log.Warn("api: destroying a sandbox made after its record was destroyed", "account", rec.AccountID, "sandbox", rec.Name, "err", err)
	}
}

// finish completes the record of a sandbox its provider has made: the
// instance id of h (when it has one), state, and url by the one rule of
// publicURL. A create, an adoption of a crashed create and the
// reconciliation of an uncertain create (Settle) all end here, so a
// record reads the same whichever made it. A record changed meanwhile
// (ErrConflict) is read again and finished if it is still creating. A
// record destroyed meanwhile (gone, or made again under another provider
// name) is ErrNotFound: the caller's sandbox has no record (unrecorded).
func (s *Server) finish(ctx context.Context, rec store.Sandbox, p sandbox.Provider, h *sandbox.Handle, state string) (store.Sandbox, error) {
	u := s.publicURL(ctx, p, h, rec.Name)
	for attempt := 0; ; attempt++ {
		if h.InstanceID != "" {
			rec.InstanceID = h.InstanceID
		}
		rec.State, rec.URL = state, u
		out, err := s.cfg.Store.UpdateSandbox(ctx, rec)
		if !errors.Is(err, store.ErrConflict) || attempt == 2 {
			return out, err
		}
		cur, gerr := s.cfg.Store.GetSandbox(ctx, rec.AccountID, rec.Name)
		if gerr != nil {
			return rec, gerr
		}
		if cur.ProviderName != rec.ProviderName {
			// Destroyed and made again by another create meanwhile: this
			// sandbox has no record.
			return cur, fmt.Errorf("sandbox %q was destroyed while it was created: %w", rec.Name, store.ErrNotFound)
		}
		if cur.State != store.StateCreating {
			return cur, nil // finished by someone else
		}
		rec = cur
	}
}

// Settle finishes the record of a create whose outcome was uncertain
// (its create_new timed out, or its process died) once the provider says,
// by Get's info, that the sandbox exists: the record gets what the create
// would have given it, its instance id and url by the same rule, and the
// provider's state (running, suspended, else unknown). The instance id is
// that of info's raw object when it names the sandbox ({"name", "id"}, the
// object a create_new answers with on the providers that have it), else the
// record keeps what it had. A record no longer creating is returned as it
// is. The url of a sandbox publishing ports through this platform needs
// Config.BaseURL (the request that made it is gone).
func (s *Server) Settle(ctx context.Context, rec store.Sandbox, info sandbox.Info) (store.Sandbox, error) {
	if rec.State != store.StateCreating {
		return rec, nil
	}
	p, err := s.ProviderFor(rec.AccountID, rec.Provider)
	if err != nil {
		return rec, err
	}
	h := handleOf(rec)
	var raw struct {
		Name string `json:"name"`
		ID   any    `json:"id"`
	}
	if json.Unmarshal(info.Raw, &raw) == nil && raw.Name == rec.ProviderName {
		if id, ok := raw.ID.(string); ok && id != "" {
			h.InstanceID = id
		}
	}
	state := store.StateUnknown
	switch info.Status {
	case sandbox.StatusRunning:
		state = store.StateRunning
	case sandbox.StatusSuspended:
		state = store.StateSuspended
	}
	if _, ok := ctx.Value(baseKey{}).(string); !ok && s.cfg.BaseURL != "" {
		ctx = context.WithValue(ctx, baseKey{}, strings.TrimRight(s.cfg.BaseURL, "/"))
	}
	return s.finish(ctx, rec, p, h, state)
}

// intent records a bounded write's intent before the write is made. A
// store that cannot record it refuses the write: Unavailable{store} (503
// unavailable), and the provider is not called, since an uncertain
// outcome with no intent could never be reconciled.
func (s *Server) intent(ctx context.Context, in store.Intent) (int64, error) {
	id, err := s.cfg.Store.AddIntent(ctx, in)
	if errors.Is(err, store.ErrAlreadyExists) {
		// An operation id the sandbox has used: never sent again, whatever
		// became of the first (its outcome is the first call's answer).
		return 0, &apiError{http.StatusConflict, &Error{Kind: "already_exists", Reason: "operation_id",
			Message: fmt.Sprintf("operation id %q was used for sandbox %q already: a bounded operation is made once per operation id (use a new one for a new checkpoint)", in.Arg, in.Name)}}
	}
	if err != nil {
		s.log.Warn("api: recording an intent", "op", in.Op, "account", in.AccountID, "sandbox", in.Name, "err", err)
		return 0, sandbox.Unavailable("store", fmt.Errorf("recording the intent of %s: %w", in.Op, err))
	}
	return id, nil
}

// outcome records an intent's outcome: confirmed when the provider
// answered (yes or a definitive no), uncertain on a transient failure. An
// outcome the store cannot record leaves the intent pending, which
// lifecycle settles by looking once its grace period is over.
func (s *Server) outcome(ctx context.Context, id int64, err error) {
	if id == 0 {
		return
	}
	state, detail := store.IntentConfirmed, ""
	if err != nil {
		detail = sandbox.Kind(err) + ": " + err.Error()
		if sandbox.Transient(err) {
			state = store.IntentUncertain
		}
	}
	if serr := s.cfg.Store.SetIntent(context.WithoutCancel(ctx), id, state, detail); serr != nil {
		s.log.Warn("api: recording an intent's outcome (left pending for lifecycle)", "intent", id, "state", state, "err", serr)
	}
}

// publicURL is the sandbox's URL where the provider advertises one, else
// "": for a provider whose sandboxes publish on this host (PortPublisher),
// the platform's proxy of the first port (never the host's loopback
// address, which only this host reaches and no key guards).
func (s *Server) publicURL(ctx context.Context, p sandbox.Provider, h *sandbox.Handle, name string) string {
	if !p.Capabilities().Has(sandbox.CapPublicURL) {
		return ""
	}
	if u, ok, _ := portURL(ctx, p, h, name); ok {
		return u
	}
	u, err := sandbox.NewRegistry(p).PublicURL(ctx, h)
	if err != nil {
		return ""
	}
	return u
}

// createWait is how long a create waits for a concurrent create of the
// same name to finish; a record still "creating" after it is a crashed
// create's.
const createWait = 2 * time.Minute

func (s *Server) adopt(ctx context.Context, rec store.Sandbox, lim sandbox.Limits) (store.Sandbox, bool, error) {
	p, err := s.ProviderFor(rec.AccountID, rec.Provider)
	if err != nil {
		return rec, false, err
	}
	// Another create of this name (here or on another replica) is under
	// way: wait for its outcome rather than race it on the provider.
	for rec.State == store.StateCreating && s.cfg.Now().Sub(rec.CreatedAt) < createWait {
		select {
		case <-ctx.Done():
			return rec, false, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		cur, err := s.cfg.Store.GetSandbox(ctx, rec.AccountID, rec.Name)
		if errors.Is(err, store.ErrNotFound) {
			return s.Create(ctx, rec.AccountID, rec.Name, rec.Provider, lim, nil, false, 0) // it failed: try ours
		}
		if err != nil {
			return rec, false, err
		}
		rec = cur
	}
	// Still "creating" after createWait: a create that crashed. The
	// provider's create adopts whatever it left.
	if rec.State == store.StateParked || rec.State == store.StateParking {
		rec, err = s.Wake(ctx, rec)
		return rec, false, err
	}
	if lim == (sandbox.Limits{}) {
		lim = rec.Limits
	}
	h, err := sandbox.NewRegistry(p).Create(ctx, rec.Provider, rec.ProviderName, recreateOptions(rec, lim))
	if err != nil {
		return rec, false, err
	}
	if rec.State == store.StateCreating {
		// The crashed create's record gets what its create would have
		// given it.
		if rec, err = s.finish(ctx, rec, p, h, store.StateRunning); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				s.unrecorded(ctx, p, h, rec)
			}
			return rec, false, err
		}
	}
	s.activity(rec.AccountID, rec.Name)
	return rec, false, nil
}

// labelFilter reads list's ?label=k=v parameters (every one must match).
func labelFilter(qs []string) ([][2]string, error) {
	out := make([][2]string, 0, len(qs))
	for _, q := range qs {
		k, v, ok := strings.Cut(q, "=")
		if !ok {
			return nil, fieldErr("label", sandbox.Invalid("label", fmt.Sprintf("label: %q is not key=value", q)))
		}
		out = append(out, [2]string{k, v})
	}
	return out, nil
}

func (s *Server) list(w http.ResponseWriter, r *http.Request, k store.Key) {
	want, err := labelFilter(r.URL.Query()["label"])
	if err != nil {
		writeErr(w, err)
		return
	}
	recs, err := s.cfg.Store.ListSandboxes(r.Context(), k.AccountID)
	if err != nil {
		writeErr(w, err)
		return
	}
	if len(want) > 0 {
		recs = slices.DeleteFunc(slices.Clone(recs), func(rec store.Sandbox) bool {
			for _, kv := range want {
				if v, ok := rec.Labels[kv[0]]; !ok || v != kv[1] {
					return true
				}
			}
			return false
		})
	}
	out := make([]Sandbox, len(recs))
	for i, rec := range recs {
		out[i] = view(rec)
	}
	s.markRunnerOffline(r.Context(), k.AccountID, recs, out) // fleet.go
	writeList(w, out)
}

func (s *Server) get(w http.ResponseWriter, r *http.Request, k store.Key) {
	rec, err := s.record(r.Context(), k, r.PathValue("name"))
	if err != nil {
		writeErr(w, err)
		return
	}
	v := view(rec)
	p, err := s.ProviderFor(rec.AccountID, rec.Provider)
	if err != nil {
		writeErr(w, err)
		return
	}
	switch {
	case (rec.State == store.StateParked || rec.State == store.StateParking) && rec.ParkedBy == store.ParkDestroy:
		// Destroyed on the provider on purpose; the record is the truth.
		v.Status = string(sandbox.StatusSuspended)
	case rec.State == store.StateCreating && s.cfg.Now().Sub(rec.CreatedAt) < 10*time.Second:
		v.Status = string(sandbox.StatusUnknown)
	default:
		info, err := sandbox.NewRegistry(p).Get(r.Context(), handleOf(rec))
		if errors.Is(err, sandbox.ErrNotFound) && rec.State == store.StateCreating {
			// Its create may still be under way (a hosted provider's can
			// take minutes), or was cut short: lifecycle settles that
			// record after its grace period, never a GET.
			v.Status = string(sandbox.StatusUnknown)
			break
		}
		if errors.Is(err, sandbox.ErrNotFound) {
			// The provider says it is surely gone: so is the record, if
			// it is still the one read (not woken, parked or made again
			// under the name since).
			_ = s.cfg.Store.DeleteSandboxIf(context.WithoutCancel(r.Context()), rec)
			writeErr(w, err)
			return
		}
		if offlineView(rec, err, &v) { // fleet.go: its runner is not connected
			writeJSON(w, http.StatusOK, v)
			return
		}
		if err != nil {
			writeErr(w, err)
			return
		}
		v.Status, v.Raw = string(info.Status), info.Raw
	}
	if caps, err := sandbox.NewRegistry(p).CapabilitiesOf(r.Context(), handleOf(rec)); err == nil {
		for _, c := range caps {
			v.Capabilities = append(v.Capabilities, string(c))
		}
	}
	writeJSON(w, http.StatusOK, v)
}

func (s *Server) destroy(w http.ResponseWriter, r *http.Request, k store.Key) {
	q := r.URL.Query()
	once := q.Get("once") == "true" || q.Get("once") == "1"
	var timeout time.Duration
	if t := q.Get("timeout_ms"); t != "" {
		n, err := strconv.ParseInt(t, 10, 64)
		if err != nil || n < 0 {
			writeErr(w, badJSON("timeout_ms", "timeout_ms must be a non-negative integer"))
			return
		}
		timeout = time.Duration(n) * time.Millisecond
	}
	rec, err := s.record(r.Context(), k, r.PathValue("name"))
	if err != nil {
		writeErr(w, err)
		return
	}
	if err := s.Destroy(r.Context(), rec, once, timeout); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// Destroy destroys the record's sandbox on its provider, then the record.
// With once it is the bounded DestroyOnce under an intent; an uncertain
// outcome keeps the record for the reconciler.
func (s *Server) Destroy(ctx context.Context, rec store.Sandbox, once bool, timeout time.Duration) error {
	defer s.lock(rec.AccountID, rec.Name)()
	p, err := s.ProviderFor(rec.AccountID, rec.Provider)
	if err != nil {
		return err
	}
	reg := sandbox.NewRegistry(p)
	if rec.State == store.StateParked && rec.ParkedBy == store.ParkDestroy {
		// Nothing on the provider to destroy, unless a wake (any replica)
		// created it again since rec was read: the record goes first, then
		// its name on the provider (nil when absent). A wake that creates
		// after this finds no record and destroys what it made (woken).
		if err := s.forget(ctx, rec); err != nil {
			return err
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ParkingStale/2)
		defer cancel()
		if err := reg.Destroy(dctx, handleOf(rec)); err != nil {
			s.log.Warn("api: destroying the name of a sandbox parked by destroy", "account", rec.AccountID, "sandbox", rec.Name, "err", err)
		}
		return nil
	}
	if once {
		id, ierr := s.intent(ctx, store.Intent{AccountID: rec.AccountID, Name: rec.Name, Op: store.OpDestroyOnce,
			Provider: rec.Provider, ProviderName: rec.ProviderName, InstanceID: rec.InstanceID})
		if ierr != nil {
			return ierr
		}
		err = reg.DestroyOnce(ctx, handleOf(rec), sandbox.DestroyOnceOptions{Timeout: timeout})
		if errors.Is(err, sandbox.ErrNotSupported) {
			_ = s.cfg.Store.SetIntent(context.WithoutCancel(ctx), id, store.IntentConfirmed, "not_supported")
			return err
		}
		s.outcome(ctx, id, err)
	} else {
		err = reg.Destroy(ctx, handleOf(rec))
	}
	if err != nil {
		return err
	}
	return s.forget(context.WithoutCancel(ctx), rec)
}

// forget deletes the record of a destroyed sandbox, if the name's record
// is still that sandbox's: another call may have destroyed it and made
// the name again meanwhile (a new sandbox, not this destroy's).
// The check and the delete are one (DeleteSandboxIf, on the provider name
// alone: a wake or a park since is still this sandbox).
func (s *Server) forget(ctx context.Context, rec store.Sandbox) error {
	err := s.cfg.Store.DeleteSandboxIf(ctx, store.Sandbox{AccountID: rec.AccountID, Name: rec.Name, ProviderName: rec.ProviderName})
	if errors.Is(err, store.ErrConflict) {
		return nil // the name's next sandbox: not this destroy's
	}
	return err
}

// withURL adds SANDBOX_URL to a command's environment where the record has
// a real URL.
func withURL(env []string, rec store.Sandbox) []string {
	if rec.URL == "" {
		return env
	}
	return append(slices.Clone(env), "SANDBOX_URL="+rec.URL)
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request, k store.Key) {
	var req ExecRequest
	if err := s.decode(w, r, &req); err != nil {
		writeErr(w, err)
		return
	}
	if req.Cmd == "" {
		writeErr(w, badJSON("cmd", "cmd is required"))
		return
	}
	if req.MaxOutput < 0 {
		writeErr(w, badJSON("max_output", "max_output is negative"))
		return
	}
	rec, p, done, ok := s.take(w, r, k)
	if !ok {
		return
	}
	defer done()
	opts := sandbox.ExecOptions{Env: withURL(req.Env, rec), Dir: req.Dir, StderrToStdout: req.StderrToStdout, MaxOutput: req.MaxOutput,
		Timeout: time.Duration(req.TimeoutMS) * time.Millisecond}
	if req.TimeoutMS < 0 {
		opts.Timeout = -1
	}
	res, err := sandbox.NewRegistry(p).Exec(r.Context(), handleOf(rec), sandbox.Cmd{Name: req.Cmd, Args: req.Args}, opts)
	if err != nil {
		writeErr(w, err)
		return
	}
	if res.Output == nil {
		res.Output = []byte{}
	}
	writeJSON(w, http.StatusOK, ExecResult{Output: res.Output, ExitCode: res.ExitCode, Truncated: res.Truncated})
}

func (s *Server) sessions(w http.ResponseWriter, r *http.Request, k store.Key) {
	rec, p, done, ok := s.take(w, r, k)
	if !ok {
		return
	}
	defer done()
	ss, err := sandbox.NewRegistry(p).ListSessions(r.Context(), handleOf(rec))
	if err != nil {
		writeErr(w, err)
		return
	}
	out := make([]Session, 0, len(ss))
	for _, x := range ss {
		v := Session{ID: x.ID, Command: x.Command, TTY: x.TTY, State: x.State}
		if x.State == sandbox.SessionExited {
			code := x.ExitCode
			v.ExitCode = &code
		}
		if !x.CreatedAt.IsZero() {
			t := x.CreatedAt
			v.CreatedAt = &t
		}
		if !x.LastActivityAt.IsZero() {
			t := x.LastActivityAt
			v.LastActivityAt = &t
		}
		out = append(out, v)
	}
	writeJSON(w, http.StatusOK, map[string]any{"data": out})
}

func (s *Server) terminate(w http.ResponseWriter, r *http.Request, k store.Key) {
	var req TerminateRequest
	if err := s.decode(w, r, &req); err != nil {
		writeErr(w, err)
		return
	}
	rec, p, done, ok := s.take(w, r, k)
	if !ok {
		return
	}
	defer done()
	sid := r.PathValue("session")
	if err := s.SessionUsable(r.Context(), rec, sid); err != nil {
		writeErr(w, err)
		return
	}
	opts := sandbox.TerminateOptions{Mode: sandbox.TerminateMode(req.Mode), Timeout: time.Duration(req.TimeoutMS) * time.Millisecond}
	if _, err := sandbox.ValidateTermination(sid, opts); err != nil {
		// Name what is wrong: the path's session, or a field of the body.
		field := "session"
		if _, err := sandbox.ValidateTermination(sid, sandbox.TerminateOptions{}); err == nil {
			field = "timeout_ms"
			if _, err := sandbox.ValidateTermination(sid, sandbox.TerminateOptions{Mode: opts.Mode}); err != nil {
				field = "mode"
			}
		}
		writeErr(w, fieldErr(field, err))
		return
	}
	id, err := s.intent(r.Context(), store.Intent{AccountID: rec.AccountID, Name: rec.Name, Op: store.OpTerminateSession,
		Provider: rec.Provider, ProviderName: rec.ProviderName, InstanceID: rec.InstanceID, Arg: sid})
	if err != nil {
		writeErr(w, err)
		return
	}
	err = sandbox.NewRegistry(p).TerminateSession(r.Context(), handleOf(rec), sid, opts)
	if errors.Is(err, sandbox.ErrNotSupported) {
		_ = s.cfg.Store.SetIntent(context.WithoutCancel(r.Context()), id, store.IntentConfirmed, "not_supported")
	} else {
		s.outcome(r.Context(), id, err)
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// SessionUsable refuses every use of a session (terminate, attach, and
// stdin, which an attach carries) while an intent to terminate it has an
// unknown outcome on this sandbox (uncertain: its call failed in a way
// that leaves it unknown, a 503 termination_unconfirmed; or pending for
// longer than ParkingStale, a call that died): 503
// unavailable{termination_unconfirmed}, until lifecycle settles the intent
// by looking. A second terminate would send the write again, and an attach
// would hand out a session that may be ending. A terminate still under
// way (pending, fresh) does not block: concurrent terminations of one
// session get one verdict from the provider. A store that cannot say is
// 503 unavailable{store}: unknown is not clear.
func (s *Server) SessionUsable(ctx context.Context, rec store.Sandbox, sessionID string) error {
	ins, err := s.cfg.Store.IntentsOf(ctx, rec.AccountID, rec.Name)
	if err != nil {
		return sandbox.Unavailable("store", fmt.Errorf("reading the intents of session %s: %w", sessionID, err))
	}
	for _, in := range ins {
		if in.Op == store.OpTerminateSession && in.Arg == sessionID && in.ProviderName == rec.ProviderName &&
			(in.State == store.IntentUncertain || in.State == store.IntentPending && s.cfg.Now().Sub(in.UpdatedAt) > ParkingStale) {
			return sandbox.Unavailable(sandbox.ReasonTerminationUnconfirm, fmt.Errorf(
				"session %s has a termination whose outcome is not known yet (intent %d, %s): it is not used until reconciliation settles it", sessionID, in.ID, in.State))
		}
	}
	return nil
}

func (s *Server) suspend(w http.ResponseWriter, r *http.Request, k store.Key) {
	rec, p, done, ok := s.take(w, r, k)
	if !ok {
		return
	}
	defer done()
	if err := sandbox.NewRegistry(p).Suspend(r.Context(), handleOf(rec)); err != nil {
		writeErr(w, err)
		return
	}
	s.setState(r.Context(), rec, store.StateSuspended)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) resume(w http.ResponseWriter, r *http.Request, k store.Key) {
	rec, p, done, ok := s.take(w, r, k)
	if !ok {
		return
	}
	defer done()
	if _, err := sandbox.NewRegistry(p).Resume(r.Context(), handleOf(rec)); err != nil {
		writeErr(w, err)
		return
	}
	s.setState(r.Context(), rec, store.StateRunning)
	rec.State = store.StateRunning
	writeJSON(w, http.StatusOK, view(rec))
}

// noPath is the refusal of a file call without its path.
func noPath() error {
	return fieldErr("path", sandbox.Invalid("path", "the path query parameter is required (?path=/abs/file)"))
}

// writeFile and readFile are in files.go.

func (s *Server) networkPolicy(w http.ResponseWriter, r *http.Request, k store.Key) {
	var req PolicyRequest
	if err := s.decode(w, r, &req); err != nil {
		writeErr(w, err)
		return
	}
	rec, p, done, ok := s.take(w, r, k)
	if !ok {
		return
	}
	defer done()
	if err := sandbox.NewRegistry(p).ApplyNetworkPolicy(r.Context(), handleOf(rec), sandbox.NetworkPolicy{Allow: req.Allow}); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) url(w http.ResponseWriter, r *http.Request, k store.Key) {
	rec, p, done, ok := s.take(w, r, k)
	if !ok {
		return
	}
	defer done()
	if rec.URL != "" {
		writeJSON(w, http.StatusOK, map[string]string{"url": rec.URL})
		return
	}
	if !p.Capabilities().Has(sandbox.CapPublicURL) {
		writeErr(w, sandbox.ErrUnsupported)
		return
	}
	u, ok, err := portURL(context.WithValue(r.Context(), baseKey{}, s.baseURL(r)), p, handleOf(rec), rec.Name)
	switch {
	case !ok:
		u, err = sandbox.NewRegistry(p).PublicURL(r.Context(), handleOf(rec))
	case err == nil && u == "":
		err = sandbox.Invalid("no_published_port", "the sandbox publishes no port: create it with publish (managoat create --publish PORT)")
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	rec.URL = u
	_, _ = s.cfg.Store.UpdateSandbox(r.Context(), rec)
	writeJSON(w, http.StatusOK, map[string]string{"url": u})
}

func (s *Server) checkpoint(w http.ResponseWriter, r *http.Request, k store.Key) {
	var req CheckpointRequest
	if err := s.decode(w, r, &req); err != nil {
		writeErr(w, err)
		return
	}
	rec, p, done, ok := s.take(w, r, k)
	if !ok {
		return
	}
	defer done()
	reg := sandbox.NewRegistry(p)
	var id string
	var err error
	if req.OperationID != "" {
		iid, ierr := s.intent(r.Context(), store.Intent{AccountID: rec.AccountID, Name: rec.Name, Op: store.OpCheckpointOnce,
			Provider: rec.Provider, ProviderName: rec.ProviderName, InstanceID: rec.InstanceID, Arg: req.OperationID})
		if ierr != nil {
			writeErr(w, ierr)
			return
		}
		id, err = reg.CreateCheckpointOnce(r.Context(), handleOf(rec), sandbox.CheckpointOnceOptions{OperationID: req.OperationID,
			Timeout: time.Duration(req.TimeoutMS) * time.Millisecond})
		s.outcome(r.Context(), iid, err)
	} else {
		id, err = reg.CreateCheckpoint(r.Context(), handleOf(rec), sandbox.CheckpointOptions{Comment: req.Comment})
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]string{"id": id})
}

func (s *Server) restore(w http.ResponseWriter, r *http.Request, k store.Key) {
	rec, p, done, ok := s.take(w, r, k)
	if !ok {
		return
	}
	defer done()
	if err := sandbox.NewRegistry(p).RestoreCheckpoint(r.Context(), handleOf(rec), r.PathValue("checkpoint")); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) providers(w http.ResponseWriter, r *http.Request, k store.Key) {
	out := []ProviderInfo{}
	for _, name := range []string{policy.Local, policy.Sprites, policy.E2B, policy.Daytona, policy.Runner} {
		out = append(out, s.providerInfo(k, name))
	}
	for name := range s.cfg.Providers {
		if !slices.ContainsFunc(out, func(p ProviderInfo) bool { return p.Name == name }) {
			out = append(out, s.providerInfo(k, name))
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"default": s.cfg.Policy.Default(), "data": out})
}

func (s *Server) providerInfo(k store.Key, name string) ProviderInfo {
	pi := ProviderInfo{Name: name, Enabled: s.cfg.Policy.Enabled(name), Default: s.cfg.Policy.Default() == name, Why: s.cfg.Policy.WhyDisabled(name)}
	if p, err := s.ProviderFor(k.AccountID, name); err == nil {
		for _, c := range p.Capabilities() {
			pi.Capabilities = append(pi.Capabilities, string(c))
		}
	} else if pi.Enabled {
		pi.Enabled, pi.Why = false, "not configured on this platform"
	}
	return pi
}

// Policy returns the server's provider policy.
func (s *Server) Policy() *policy.Policy { return s.cfg.Policy }

// Park parks an idle sandbox on its provider: Suspend where the sandbox
// can suspend, otherwise Destroy (never a pretended park); the record
// then says parked, and by which. It refuses (ErrConflict) a record used
// after idleSince, parked or being parked, or with a call or stream open
// in this process.
//
// Against a call starting meanwhile on any replica, the park first claims
// the record (state parking, compare-and-set on its Version) and then
// reads it again: a call marks its activity before it reads the record
// (use), so either that mark is seen here and the claim is withdrawn, or
// the call sees the claim and waits for the park to end, then wakes the
// sandbox. The provider's call is bounded by ParkingStale/2; when it
// fails the claim is withdrawn (state as it was), unless the failure is
// transient (unavailable, timed out): then the provider is asked whether
// the park was made all the same (parked), the sandbox runs (withdrawn),
// or it cannot say (the claim stays, for lifecycle to settle).
func (s *Server) Park(ctx context.Context, rec store.Sandbox, idleSince time.Time) (store.Sandbox, error) {
	defer s.lock(rec.AccountID, rec.Name)()
	cur, err := s.cfg.Store.GetSandbox(ctx, rec.AccountID, rec.Name)
	if err != nil {
		return rec, err
	}
	if cur.State == store.StateParked || cur.State == store.StateParking || cur.LastActivity.After(idleSince) || s.Active(cur.AccountID, cur.Name) {
		return cur, store.ErrConflict
	}
	p, err := s.ProviderFor(cur.AccountID, cur.Provider)
	if err != nil {
		return cur, err
	}
	reg := sandbox.NewRegistry(p)
	h := handleOf(cur)
	caps, err := reg.CapabilitiesOf(ctx, h)
	if err != nil {
		return cur, err
	}
	by := store.ParkSuspend
	if !caps.Has(sandbox.CapSuspend) {
		by = store.ParkDestroy
	}
	prev := cur.State
	claim := cur
	claim.State, claim.ParkedAt, claim.ParkedBy = store.StateParking, s.cfg.Now().UTC(), by
	claimed, err := s.cfg.Store.UpdateSandbox(ctx, claim)
	if err != nil {
		return cur, err
	}
	again, err := s.cfg.Store.GetSandbox(ctx, cur.AccountID, cur.Name)
	if err != nil || again.Version != claimed.Version || again.LastActivity.After(cur.LastActivity) || s.Active(cur.AccountID, cur.Name) {
		// Used since the check (a call marked its activity before the
		// claim, or during it), or the claim is in doubt: withdraw it.
		s.unclaim(ctx, claimed, prev)
		if err != nil {
			return cur, err
		}
		return again, store.ErrConflict
	}
	pctx, cancel := context.WithTimeout(ctx, ParkingStale/2)
	defer cancel()
	if by == store.ParkSuspend {
		err = reg.Suspend(pctx, h)
	} else {
		err = reg.Destroy(pctx, h)
	}
	if err != nil && sandbox.Transient(err) {
		// Unavailable or timed out: the park may have been made (a
		// pause of a large sandbox can outlast the bound). Look before
		// withdrawing the claim: withdrawn over a suspended sandbox, the
		// record would say running and no call would wake it.
		switch s.parkMade(ctx, reg, h, by) {
		case parkDone:
			err = nil
		case parkInDoubt:
			// The claim stays: calls wait for it (at most ParkingStale
			// from the claim) and lifecycle settles it from the provider.
			return cur, err
		}
	}
	if err != nil {
		s.unclaim(ctx, claimed, prev)
		return cur, err
	}
	claimed.State = store.StateParked
	return s.cfg.Store.UpdateSandbox(context.WithoutCancel(ctx), claimed)
}

// What a look at the provider says of a park whose call failed.
const (
	parkNotMade = iota // the sandbox runs as before: withdraw the claim
	parkDone           // suspended, or destroyed: the park was made
	parkInDoubt        // the provider could not say
)

// parkMade looks (Get, bounded by 10 s) whether a park whose provider call
// failed was made all the same.
func (s *Server) parkMade(ctx context.Context, reg *sandbox.Registry, h *sandbox.Handle, by string) int {
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	info, err := reg.Get(gctx, h)
	switch {
	case by == store.ParkDestroy && errors.Is(err, sandbox.ErrNotFound):
		return parkDone
	case err != nil:
		return parkInDoubt
	case by == store.ParkSuspend && info.Status == sandbox.StatusSuspended:
		return parkDone
	case info.Status == sandbox.StatusRunning:
		return parkNotMade
	}
	return parkInDoubt
}

// unclaim withdraws a park's claim: the record goes back to state prev,
// unless it is no longer that claim (changed, or gone).
func (s *Server) unclaim(ctx context.Context, claimed store.Sandbox, prev string) {
	ctx = context.WithoutCancel(ctx)
	for range 3 {
		rec := claimed
		rec.State, rec.ParkedAt, rec.ParkedBy = prev, time.Time{}, ""
		_, err := s.cfg.Store.UpdateSandbox(ctx, rec)
		if !errors.Is(err, store.ErrConflict) {
			return
		}
		cur, err := s.cfg.Store.GetSandbox(ctx, claimed.AccountID, claimed.Name)
		if err != nil || cur.State != store.StateParking || !cur.ParkedAt.Equal(claimed.ParkedAt) {
			return
		}
		claimed = cur
	}
}
