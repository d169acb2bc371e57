// Package store is the platform's record keeping: accounts, their API keys
// (hashed), their sandboxes (which provider each lives on, its
// provider-side name and instance, state, URL, activity, parking) and the
// intents of bounded operations. Store is the interface the platform uses;
// store/sqlite is the embedded default, and a Postgres store meets the same
// interface and passes the same kit, store/storetest.
//
// The interface is shaped for several replicas on one database: InsertSandbox
// is the one arbiter of a name (two replicas creating the same name: one
// insert wins, the other gets ErrAlreadyExists and adopts the winner's
// record), and UpdateSandbox is compare-and-set on Version (and the
// provider name, which tells a name's sandboxes apart), so a replica
// never overwrites what another wrote after it read (ErrConflict: read
// again); DeleteSandboxIf is the same check for a delete, so a replica
// never deletes a record another made or moved after it read. Every
// method is safe for concurrent use.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// Errors. ErrNotFound and ErrAlreadyExists are the sandbox taxonomy's, so a
// record's absence or conflict maps to the API's 404 and 409 directly.
var (
	ErrNotFound      = sandbox.ErrNotFound
	ErrAlreadyExists = sandbox.ErrAlreadyExists
	// ErrConflict: UpdateSandbox lost a race (the record's Version moved).
	ErrConflict = errors.New("store: the record changed since it was read")
	// ErrInUse: DeleteAccount of an account that still holds sandboxes.
	ErrInUse = errors.New("store: the account still holds sandboxes or operations under way")
)

// Account owns API keys, sandboxes and runners.
type Account struct {
	ID        string
	Name      string // unique
	CreatedAt time.Time
}

// Key is an API key's record: the secret itself is stored nowhere, only
// its SHA-256 (a key is 32 random bytes, so a slow hash adds nothing).
type Key struct {
	ID        string // public part of the key, unique
	AccountID string
	Hash      []byte // SHA-256 of the secret part
	Label     string
	CreatedAt time.Time
	RevokedAt time.Time // zero while valid
}

// Sandbox states the platform records.
const (
	StateCreating  = "creating"  // the record exists, the provider's create is under way or was cut short
	StateRunning   = "running"   // the provider said so, or the last call on it succeeded
	StateSuspended = "suspended" // suspended by its user
	StateParked    = "parked"    // parked for idleness (ParkedBy says how); the next use wakes it
	StateParking   = "parking"   // a park claimed the record (ParkedBy, ParkedAt) and is under way; a use waits, then wakes it
	StateUnknown   = "unknown"   // the provider's status is unrecognised
)

// Parking methods.
const (
	ParkSuspend = "suspend" // the provider suspended it, disk kept
	ParkDestroy = "destroy" // the provider has no suspend: it was destroyed; a wake creates it anew
)

// Sandbox is one sandbox's record.
type Sandbox struct {
	AccountID    string
	Name         string // the account's name for it, unique per account
	Provider     string // the provider that created it; never changes
	ProviderName string // its name on the provider (unique per provider)
	InstanceID   string // the provider's incarnation id, when known
	State        string
	URL          string // real or empty
	Limits       sandbox.Limits
	CreatedAt    time.Time
	LastActivity time.Time
	ParkedAt     time.Time // zero unless parked
	ParkedBy     string    // ParkSuspend or ParkDestroy when parked
	// Image is the OCI image reference it was created from ("" the
	// provider's default); a wake from a park by destroy creates it from
	// the same image. Labels are its user's key=value pairs. Both are set
	// by InsertSandbox and never changed by UpdateSandbox.
	Image  string
	Labels map[string]string
	// Version is bumped by every update; UpdateSandbox matches on it.
	Version int64
}

// LabelsJSON is how the stores keep Labels in their labels column: a
// JSON object, "" for none.
func LabelsJSON(l map[string]string) string {
	if len(l) == 0 {
		return ""
	}
	b, _ := json.Marshal(l) // a map of strings always marshals
	return string(b)
}

// ParseLabels reads a labels column LabelsJSON wrote.
func ParseLabels(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	var l map[string]string
	if err := json.Unmarshal([]byte(s), &l); err != nil {
		return nil, fmt.Errorf("store: a record's labels: %w", err)
	}
	return l, nil
}

// PreviewLink is one preview link's record.
type PreviewLink struct {
	ID           string
	AccountID    string
	Sandbox      string // the account's sandbox name
	ProviderName string // of the sandbox it was made for: a sandbox made again under the name is another
	Port         int
	CreatedAt    time.Time
	ExpiresAt    time.Time
	RevokedAt    time.Time // zero while valid
}

// Intent states.
const (
	IntentPending   = "pending"   // recorded before the call; the outcome is not known yet
	IntentConfirmed = "confirmed" // the provider confirmed the outcome
	IntentUncertain = "uncertain" // the call failed in a way that leaves the outcome unknown
	IntentResolved  = "resolved"  // an uncertain intent reconciled later (Detail says how)
)

// Intent operations.
const (
	OpCreateNew        = "create_new"
	OpDestroyOnce      = "destroy_once"
	OpCheckpointOnce   = "create_checkpoint_once"
	OpTerminateSession = "terminate_session"
)

// Intent records a bounded write before it is made, and its outcome after.
type Intent struct {
	ID           int64
	AccountID    string
	Name         string // the account's sandbox name
	Op           string
	Provider     string
	ProviderName string
	InstanceID   string
	Arg          string // the operation's own key (session id, operation id)
	State        string
	Detail       string
	CreatedAt    time.Time
	UpdatedAt    time.Time
}

// Runner is a runner name an account holds. ID is what the runner's
// sandboxes route to: random when the name is first claimed, never derived
// from the account and the name, and kept for as long as the record is
// (a forgotten runner's socket is closed, its record stays). What may
// connect as the name: once Enrolled, only the runner's own enrolment
// credential; before, only the API key KeyID that claimed it (another
// key of the account only after that one is revoked or gone).
type Runner struct {
	AccountID string
	Name      string // unique per account
	ID        string // unique; a random UUID
	Enrolled  bool
	KeyID     string // the claiming API key's id while not Enrolled
	CreatedAt time.Time
}

// Store keeps the records.
type Store interface {
	CreateAccount(ctx context.Context, name string) (Account, error) // ErrAlreadyExists for a taken name
	AccountByName(ctx context.Context, name string) (Account, error)
	AccountByID(ctx context.Context, id string) (Account, error)
	ListAccounts(ctx context.Context) ([]Account, error)
	// DeleteAccount removes the account of that ID with its keys, its
	// runner records and schedules and its settled intents: ErrInUse while it holds a
	// sandbox record or an open intent (its sandboxes are destroyed first:
	// a record dropped here would leave a provider's sandbox that no
	// account owns), ErrNotFound when there is no such account. The check
	// and the delete are one statement: a create between them is not lost.
	DeleteAccount(ctx context.Context, id string) error

	AddKey(ctx context.Context, k Key) error // ErrAlreadyExists for a taken ID
	KeyByID(ctx context.Context, id string) (Key, error)
	ListKeys(ctx context.Context, accountID string) ([]Key, error)
	RevokeKey(ctx context.Context, id string, at time.Time) error

	// InsertSandbox adds a record with Version 1; ErrAlreadyExists when the
	// account has a sandbox of that name (the one arbiter of concurrent
	// creates) or the provider has one of that ProviderName.
	InsertSandbox(ctx context.Context, s Sandbox) error
	GetSandbox(ctx context.Context, accountID, name string) (Sandbox, error)
	// ListSandboxes lists an account's records ("" lists every account's),
	// ordered by account then name.
	ListSandboxes(ctx context.Context, accountID string) ([]Sandbox, error)
	// UpdateSandbox writes s if the stored record is the same sandbox
	// (its ProviderName, which an update never changes) at s.Version, and
	// returns the record with its new Version; ErrConflict otherwise,
	// ErrNotFound when it is gone. The ProviderName is matched because
	// Version starts again at 1 with each insert: a record destroyed and
	// made again (a new ProviderName) may be at the Version a stale copy of
	// the old one has.
	UpdateSandbox(ctx context.Context, s Sandbox) (Sandbox, error)
	// TouchSandbox moves LastActivity forward to at (never back), without
	// a version check: activity is not a state change.
	TouchSandbox(ctx context.Context, accountID, name string, at time.Time) error
	// DeleteSandbox removes the record; nil when it is already gone.
	DeleteSandbox(ctx context.Context, accountID, name string) error
	// DeleteSandboxIf removes the record of s.AccountID and s.Name only if
	// it is still s's sandbox: the stored ProviderName is s.ProviderName
	// and, when s.Version is not 0, the stored Version is s.Version. It is
	// nil when the record is removed or already gone, ErrConflict when the
	// name's record is another (a new sandbox of the name, made through
	// another replica since s was read) or has moved on. The check and the
	// delete are one statement: a path that read a record, then deletes it,
	// never deletes the name's next sandbox.
	DeleteSandboxIf(ctx context.Context, s Sandbox) error

	// AddRunner records a runner name; ErrAlreadyExists when the account
	// holds the name (the one arbiter of two first connections) or the ID
	// is taken.
	AddRunner(ctx context.Context, r Runner) error
	RunnerByName(ctx context.Context, accountID, name string) (Runner, error)
	// ListRunners lists an account's runner records by name.
	ListRunners(ctx context.Context, accountID string) ([]Runner, error)
	// UpdateRunner writes next's Enrolled and KeyID over the record of
	// prev's account and name while it is still prev (its ID, Enrolled
	// and KeyID): ErrConflict when it moved, ErrNotFound when it is gone.
	// The ID and name never change.
	UpdateRunner(ctx context.Context, prev, next Runner) error
	// DeleteRunner removes a runner record (an operator's act: it frees
	// the name, and its next claimant gets a new ID); nil when gone.
	DeleteRunner(ctx context.Context, accountID, name string) error

	// AddIntent records an intent (State pending) and returns its ID. A
	// create_checkpoint_once intent whose operation id (Arg) the sandbox
	// (Provider, ProviderName) has had already is ErrAlreadyExists: an
	// operation id is used once per sandbox, whatever became of the first.
	AddIntent(ctx context.Context, in Intent) (int64, error)
	// IntentsOf lists the intents recorded for the account's sandbox name,
	// every state, oldest first.
	IntentsOf(ctx context.Context, accountID, name string) ([]Intent, error)
	// SetIntent records an intent's outcome.
	SetIntent(ctx context.Context, id int64, state, detail string) error
	// OpenIntents lists the intents still pending or uncertain, oldest first.
	OpenIntents(ctx context.Context) ([]Intent, error)
	// PruneIntents removes the settled intents (confirmed, resolved) last
	// updated before before, and says how many; an open one (pending,
	// uncertain) is never removed, nor a create_checkpoint_once one while
	// its sandbox has a record (its operation id stays used). Every
	// bounded write adds an intent, so without it the table grows for as
	// long as the platform runs.
	PruneIntents(ctx context.Context, before time.Time) (int64, error)

	// Preview links (platform/api/preview.go): each link handed out is
	// recorded, so one can be revoked by its id. AddPreviewLink is
	// ErrAlreadyExists for a taken ID; PreviewLinkByID ErrNotFound for
	// none; ListPreviewLinks lists a sandbox's links (those of
	// ProviderName, the sandbox of the name now) oldest first;
	// RevokePreviewLink sets RevokedAt (kept if set already), ErrNotFound
	// when the account's sandbox name has no such link.
	AddPreviewLink(ctx context.Context, l PreviewLink) error
	PreviewLinkByID(ctx context.Context, id string) (PreviewLink, error)
	ListPreviewLinks(ctx context.Context, accountID, sandbox, providerName string) ([]PreviewLink, error)
	RevokePreviewLink(ctx context.Context, accountID, sandbox, id string, at time.Time) error

	// Placer: placement on runners (placement.go).
	Placer

	Close() error
}
