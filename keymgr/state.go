package keymgr

import (
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"time"

	"github.com/meshca/meshca/keymgr/upstream"
)

// Phase is where an authority is in its life. An authority moves only
// forward: prepared → active → previous → retired.
type Phase string

// Phases of an authority.
const (
	// PhasePrepared: trusted (its root is in the bundle), not signing.
	PhasePrepared Phase = "prepared"
	// PhaseActive: trusted and signing; exactly one authority is active.
	PhaseActive Phase = "active"
	// PhasePrevious: trusted, no longer signing; leaves it issued may
	// still be live.
	PhasePrevious Phase = "previous"
	// PhaseRetired: no longer trusted; kept in the history, its private
	// key destroyed.
	PhaseRetired Phase = "retired"
)

// Transition is one step in an authority's history.
type Transition struct {
	To Phase     `json:"to"`
	At time.Time `json:"at"`
	// Reason says why: "generated on first start", an operator's
	// --reason, an automatic threshold.
	Reason string `json:"reason,omitempty"`
	// Forced: a guard was overridden (--force).
	Forced bool `json:"forced,omitempty"`
}

// AuthorityRecord is one authority of a CA state: a root, or a root with
// the intermediate that signs under it. Several authorities may share a
// root: an intermediate renewed or re-keyed under the root workloads
// already trust is a new authority, which may become active at once.
type AuthorityRecord struct {
	Phase Phase
	// Root is the self-signed certificate workloads trust.
	Root *x509.Certificate
	// Cert signs leaves: Root itself, or an intermediate under it whose
	// path up to Root (without Root) is Chain.
	Cert  *x509.Certificate
	Chain []*x509.Certificate
	// Key is Cert's private key; nil once retired (destroyed), and for an
	// external authority whose key lives in the backend (Vault, cfssl).
	Key crypto.Signer
	// External: meshca manages this authority's trust, not its key.
	External bool
	// Generated: meshca generated the key (automatic rotation applies);
	// false for an imported authority.
	Generated bool
	// LatestLeafNotAfter is the latest NotAfter a leaf issued under this
	// authority may have: the server records it before it issues past it,
	// so no leaf outlives it.
	LatestLeafNotAfter time.Time
	// LongestLeafTTL is the longest lifetime of a leaf issued under this
	// authority, as recorded by the server.
	LongestLeafTTL time.Duration
	// Upstream, for an authority whose intermediate meshca renews itself
	// (meshca serve --upstream), names where its root's key is; zero for
	// every other authority. Renewed: Upstream is set.
	Upstream upstream.Ref
	// RootKey is Root's private key when the CA state keeps it (the self
	// upstream), shared by the authorities under that root; nil for every
	// other authority, and once retired (the last one retired under a
	// root destroys it).
	RootKey crypto.Signer
	// History lists every transition, oldest first; the last one is the
	// current Phase.
	History []Transition
	// madeKey: Renewer.NewAuthority made the root's key in the upstream
	// (not adopted, not kept in the state) in this process; never stored,
	// so a loaded record is never one Renewer.Discard destroys.
	madeKey bool
}

// ID names an authority: the hex SHA-256 fingerprint of its signing
// certificate, which is its root's unless an intermediate signs.
// It is empty for a record without one, which no valid state holds.
func (r *AuthorityRecord) ID() string {
	if r.Cert == nil {
		return ""
	}
	return Fingerprint(r.Cert)
}

// RootID is the hex SHA-256 fingerprint of the authority's root, which
// authorities sharing the root have in common.
func (r *AuthorityRecord) RootID() string {
	if r.Root == nil {
		return ""
	}
	return Fingerprint(r.Root)
}

// Renewed reports whether meshca renews r's intermediate from an
// upstream.
func (r *AuthorityRecord) Renewed() bool { return r.Upstream.Type != "" }

// SignsWithRoot reports whether the root itself signs leaves (no
// intermediate).
func (r *AuthorityRecord) SignsWithRoot() bool { return r.Cert.Equal(r.Root) }

// Issued is when the authority's signing certificate began its life:
// its NotBefore, or, when that was backdated to tolerate clocks that
// disagree, when the authority entered the state, if later. A renewal's
// point in its life counts from it.
func (r *AuthorityRecord) Issued() time.Time {
	if len(r.History) > 0 && r.History[0].At.After(r.Cert.NotBefore) {
		return r.History[0].At
	}
	return r.Cert.NotBefore
}

// Since is when the authority entered its current phase.
func (r *AuthorityRecord) Since() time.Time {
	if len(r.History) == 0 {
		return time.Time{}
	}
	return r.History[len(r.History)-1].At
}

// Fingerprint is the hex SHA-256 of c's DER encoding.
func Fingerprint(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return hex.EncodeToString(sum[:])
}

// State is a CA's whole lifecycle state: every authority it knows, in the
// order they were added, and a sequence number that grows with every
// change of the trust bundle.
type State struct {
	// Sequence only grows; it is the SPIFFE bundle's sequence number.
	Sequence uint64
	// Authorities, oldest first.
	Authorities []*AuthorityRecord
	// Revocations lists the certificates revoked and not yet expired,
	// in the order they were revoked (revocation.go).
	Revocations []Revocation
	// Blocked lists the nodes that may get no new certificate.
	Blocked []NodeBlock
	// CRLs holds the newest CRL of each CA that signs, at most one per
	// issuer.
	CRLs []CRLRecord
}

// Version identifies one stored revision of a State, for compare-and-swap:
// a resourceVersion, a file generation. The zero Version means "nothing
// stored yet".
type Version string

// ErrConflict is returned by a StateStore's Save when the stored state is no
// longer the version the caller read: load it again and redo the change
// on what is there now.
var ErrConflict = errors.New("keymgr: the stored CA state changed since it was read")

// ErrNoState is returned by a StateStore's Load when nothing is stored yet.
var ErrNoState = errors.New("keymgr: no CA state stored")

// StateStore keeps a CA state. Implementations: the local state directory and a
// Kubernetes Secret. Every StateStore passes the contract suite in
// keymgr/storetest.
type StateStore interface {
	// Load returns the stored state and its version, or ErrNoState.
	Load(ctx context.Context) (*State, Version, error)
	// Save stores s if the stored version is still base (the zero
	// Version: nothing stored), and returns the new version; otherwise it
	// changes nothing and returns ErrConflict.
	Save(ctx context.Context, s *State, base Version) (Version, error)
}

// Lineage names the history s belongs to, in which Sequence orders the
// states: a digest of its first authority's ID and the second that
// authority entered the state. A state built anew, even on the same
// certificate (a lost Secret, the same cacerts imported again), is
// another lineage; a restored backup is the same one. Empty for a state
// without authorities.
func (v View) Lineage() string {
	if len(v.State.Authorities) == 0 {
		return ""
	}
	first := v.State.Authorities[0]
	h := sha256.New()
	h.Write([]byte(first.ID()))
	if len(first.History) > 0 {
		h.Write([]byte(first.History[0].At.UTC().Truncate(time.Second).Format(time.RFC3339)))
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// View is the read-only side of a State: what its records say about the
// steps (NextStep, Due), the roots still in use, the lineage. The State
// itself keeps the steps that change it and the lookups they rest on.
type View struct {
	State *State
}

// View returns the queries of s.
func (s *State) View() View { return View{State: s} }

// rules are the guards' safe-at rules over a state: when a prepared
// authority may become active, when a previous one may be retired, and
// why not yet.
type rules struct {
	s *State
	g Guards
}
