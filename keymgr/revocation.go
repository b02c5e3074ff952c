package keymgr

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"time"
)

// The revocations of a CA state: certificates revoked before they
// expire, nodes that may get no new certificate, and the CRLs meshca
// made for the CAs that sign (see crl.go).

// The verbs of revocation, as they appear in errors.
const (
	VerbRevoke   = "revoke"
	VerbUnrevoke = "unrevoke"
	VerbBlock    = "block"
	VerbUnblock  = "unblock"
)

// RevocationGrace is how long after a revoked certificate's NotAfter it
// stays on the CRL: a verifier whose clock is behind still finds it.
const RevocationGrace = 5 * time.Minute

// ErrNotRevoked: Unrevoke found no revocation of that serial.
var ErrNotRevoked = errors.New("keymgr: the certificate is not revoked")

// ErrNotBlocked: Unblock found no block of that node.
var ErrNotBlocked = errors.New("keymgr: the node is not blocked")

// Revocation is one revoked certificate, listed on its issuer's CRL
// until it expires.
type Revocation struct {
	// Serial is the revoked certificate's serial number, positive.
	Serial *big.Int
	// Issuer is the ID (hex SHA-256 fingerprint) of the CA certificate
	// that signed the revoked certificate: an authority's ID() for a
	// leaf, its RootID() (or the next CA of its chain) for an
	// intermediate. Empty for an issuer not known: the serial is then
	// listed on the CRL of every CA of the state that signs leaves.
	Issuer string
	// Reason is the RFC 5280 CRLReason code: 0 unspecified,
	// 1 keyCompromise, 2 cACompromise, 3 affiliationChanged,
	// 4 superseded, 5 cessationOfOperation, 6 certificateHold,
	// 9 privilegeWithdrawn, 10 aACompromise (7 is unused and 8 is for
	// delta CRLs only: both refused).
	Reason    int
	RevokedAt time.Time
	// NotAfter is the revoked certificate's: once it (and
	// RevocationGrace) has passed, the entry leaves the CRL and the state.
	NotAfter time.Time
	// Subject is the certificate's SPIFFE ID or subject, for people.
	Subject string
	// Node is the node whose proxy obtained the certificate, when it was
	// revoked with the node (meshca revoke --node).
	Node string
	// By says who or what revoked it, for the audit trail.
	By string
}

// Expired reports whether r is past its NotAfter and RevocationGrace at
// now: it no longer needs to be listed.
func (r Revocation) Expired(now time.Time) bool {
	return now.After(r.NotAfter.Add(RevocationGrace))
}

// NodeBlock is a node whose proxy may obtain no new certificate until an
// operator unblocks it.
type NodeBlock struct {
	Node string
	// Since is the start of the window whose certificates were revoked
	// with the block; zero when none were.
	Since time.Time
	// At is when the block was made.
	At     time.Time
	Reason string
	By     string
}

// CRLRecord is the newest CRL meshca made for one CA of the state.
// Number, ThisUpdate and NextUpdate are DER's, copied for the queries.
type CRLRecord struct {
	// Issuer is the ID (fingerprint) of the CA certificate that signed
	// the CRL.
	Issuer     string
	Number     *big.Int
	ThisUpdate time.Time
	NextUpdate time.Time
	// DER is the CRL, as x509.CreateRevocationList returns it.
	DER []byte
}

// NewCRLRecord is the record of the DER-encoded CRL der of the CA issuer.
func NewCRLRecord(issuer string, der []byte) (CRLRecord, error) {
	l, err := x509.ParseRevocationList(der)
	switch {
	case err != nil:
		return CRLRecord{}, fmt.Errorf("the CRL does not parse: %w", err)
	case l.Number == nil:
		return CRLRecord{}, errors.New("the CRL has no CRL number")
	case l.NextUpdate.IsZero():
		return CRLRecord{}, errors.New("the CRL has no nextUpdate")
	}
	return CRLRecord{Issuer: issuer, Number: l.Number, ThisUpdate: l.ThisUpdate.UTC(), NextUpdate: l.NextUpdate.UTC(), DER: der}, nil
}

// Revoke adds rs to the revocations of s, all or none: each must be
// valid (see Validate) and name as Issuer a CA of an authority that is
// not retired whose CRL meshca can sign (see CRLIssuer.Problem), or
// none. A certificate revoked already by that issuer,
// and one already expired at now, are skipped. It returns how many it
// added.
func (s *State) Revoke(rs []Revocation, now time.Time) (added int, err error) {
	v := s.View()
	seen := make(map[string]bool, len(s.Revocations))
	for _, r := range s.Revocations {
		seen[revocationKey(r.Issuer, r.Serial)] = true
	}
	var fresh []Revocation
	for i, r := range rs {
		if why := revocationRule(r); why != "" {
			return 0, &StateError{Verb: VerbRevoke, ID: r.Issuer, Reason: fmt.Sprintf("revocation %d (serial %s): %s", i+1, serialText(r.Serial), why)}
		}
		if why := v.revokeRule(r.Issuer); why != "" {
			return 0, &StateError{Verb: VerbRevoke, ID: r.Issuer, Reason: fmt.Sprintf("serial %s: %s", serialText(r.Serial), why)}
		}
		k := revocationKey(r.Issuer, r.Serial)
		if seen[k] || r.Expired(now) {
			continue
		}
		seen[k] = true
		r.Serial = new(big.Int).Set(r.Serial)
		fresh = append(fresh, r)
	}
	s.Revocations = append(s.Revocations, fresh...)
	return len(fresh), nil
}

// Unrevoke takes back the revocation of serial by issuer; an empty
// issuer takes back every revocation of serial, whatever its issuer. It
// returns an error wrapping ErrNotRevoked when there is none.
func (s *State) Unrevoke(serial *big.Int, issuer string) error {
	if serial == nil {
		return &StateError{Verb: VerbUnrevoke, Reason: "no serial number"}
	}
	kept := s.Revocations[:0:0]
	for _, r := range s.Revocations {
		if r.Serial.Cmp(serial) == 0 && (issuer == "" || r.Issuer == issuer) {
			continue
		}
		kept = append(kept, r)
	}
	if len(kept) == len(s.Revocations) {
		if issuer != "" {
			return fmt.Errorf("%w: serial %s by %.16s", ErrNotRevoked, serialText(serial), issuer)
		}
		return fmt.Errorf("%w: serial %s", ErrNotRevoked, serialText(serial))
	}
	s.Revocations = kept
	return nil
}

// Block records that b.Node may get no new certificate. A node blocked
// already stays blocked as it was.
func (s *State) Block(b NodeBlock) error {
	if why := blockRule(b); why != "" {
		return &StateError{Verb: VerbBlock, ID: b.Node, Reason: why}
	}
	if _, ok := s.NodeBlocked(b.Node); ok {
		return nil
	}
	s.Blocked = append(s.Blocked, b)
	return nil
}

// Unblock lets node get certificates again; an error wrapping
// ErrNotBlocked when it is not blocked.
func (s *State) Unblock(node string) error {
	i := slices.IndexFunc(s.Blocked, func(b NodeBlock) bool { return b.Node == node })
	if i < 0 {
		return fmt.Errorf("%w: %q", ErrNotBlocked, node)
	}
	s.Blocked = slices.Delete(slices.Clone(s.Blocked), i, i+1)
	return nil
}

// NodeBlocked returns node's block, if it is blocked.
func (s *State) NodeBlocked(node string) (NodeBlock, bool) {
	for _, b := range s.Blocked {
		if b.Node == node {
			return b, true
		}
	}
	return NodeBlock{}, false
}

// PruneRevocations drops the revocations expired at now, and returns how
// many.
func (s *State) PruneRevocations(now time.Time) int {
	kept := s.Revocations[:0:0]
	for _, r := range s.Revocations {
		if !r.Expired(now) {
			kept = append(kept, r)
		}
	}
	n := len(s.Revocations) - len(kept)
	if n > 0 {
		s.Revocations = kept
	}
	return n
}

// CRL returns the CRL record of the CA issuer, if the state has one.
func (v View) CRL(issuer string) (CRLRecord, bool) {
	for _, c := range v.State.CRLs {
		if c.Issuer == issuer {
			return c, true
		}
	}
	return CRLRecord{}, false
}

// CRLBundlePEM is every CRL of the state as PEM "X509 CRL" blocks, by
// issuer ID: the content of istio-ca-crl's ca-crl.pem. Empty when the
// state has no CRL.
func (v View) CRLBundlePEM() []byte {
	crls := slices.Clone(v.State.CRLs)
	slices.SortFunc(crls, func(a, b CRLRecord) int { return strings.Compare(a.Issuer, b.Issuer) })
	var buf bytes.Buffer
	for _, c := range crls {
		_ = pem.Encode(&buf, &pem.Block{Type: "X509 CRL", Bytes: c.DER})
	}
	return buf.Bytes()
}

// IssuerOf returns the ID of the CA of the state (of an authority not
// retired) whose certificate signed c: what a Revocation of c names as
// Issuer. An error when no such CA signed it.
func (v View) IssuerOf(c *x509.Certificate) (string, error) {
	for _, ca := range v.cas() {
		if bytes.Equal(c.RawIssuer, ca.RawSubject) && c.CheckSignatureFrom(ca) == nil {
			return Fingerprint(ca), nil
		}
	}
	return "", &StateError{Verb: VerbRevoke, Reason: fmt.Sprintf("serial %s (%q): no CA of the state that is not retired signed it", serialText(c.SerialNumber), c.Subject)}
}

// cas lists the CA certificates of every authority not retired: signing
// certificate, chain and root, each once.
func (v View) cas() []*x509.Certificate {
	var out []*x509.Certificate
	seen := map[string]bool{}
	for _, a := range v.State.Authorities {
		if a == nil || a.Phase == PhaseRetired || a.Cert == nil {
			continue
		}
		for _, c := range append(append([]*x509.Certificate{a.Cert}, a.Chain...), a.Root) {
			if id := Fingerprint(c); !seen[id] {
				seen[id] = true
				out = append(out, c)
			}
		}
	}
	return out
}

// validateRevocations checks the revocations, blocks and CRLs of s, as
// Validate does the authorities.
func (s *State) validateRevocations() error {
	seen := map[string]bool{}
	for i, r := range s.Revocations {
		if why := revocationRule(r); why != "" {
			return &StateError{Verb: verbValidate, ID: r.Issuer, Reason: fmt.Sprintf("revocation %d (serial %s): %s", i+1, serialText(r.Serial), why)}
		}
		k := revocationKey(r.Issuer, r.Serial)
		if seen[k] {
			return &StateError{Verb: verbValidate, ID: r.Issuer, Reason: fmt.Sprintf("serial %s is revoked twice by the same issuer", serialText(r.Serial))}
		}
		seen[k] = true
	}
	nodes := map[string]bool{}
	for i, b := range s.Blocked {
		if why := blockRule(b); why != "" {
			return &StateError{Verb: verbValidate, Reason: fmt.Sprintf("node block %d: %s", i+1, why)}
		}
		if nodes[b.Node] {
			return &StateError{Verb: verbValidate, Reason: fmt.Sprintf("node %q is blocked twice", b.Node)}
		}
		nodes[b.Node] = true
	}
	issuers := map[string]bool{}
	for i, c := range s.CRLs {
		if why := crlRule(c); why != "" {
			return &StateError{Verb: verbValidate, ID: c.Issuer, Reason: fmt.Sprintf("CRL %d: %s", i+1, why)}
		}
		if issuers[c.Issuer] {
			return &StateError{Verb: verbValidate, ID: c.Issuer, Reason: "two CRLs of the same issuer"}
		}
		issuers[c.Issuer] = true
	}
	return nil
}

// revocationRule is the first rule r breaks, or "".
func revocationRule(r Revocation) string {
	switch {
	case r.Serial == nil || r.Serial.Sign() <= 0:
		return "the serial number must be positive"
	case r.Serial.BitLen() > 160:
		return "the serial number is longer than 20 octets"
	case r.Issuer != "" && !isFingerprint(r.Issuer):
		return fmt.Sprintf("issuer %q is not a hex SHA-256 fingerprint", r.Issuer)
	case !validReason(r.Reason):
		return fmt.Sprintf("reason %d is not an RFC 5280 CRL reason code meshca lists (0-6, 9, 10)", r.Reason)
	case r.RevokedAt.IsZero():
		return "no revocation time"
	case r.NotAfter.IsZero():
		return "no NotAfter: the revoked certificate's is needed to drop it once expired"
	}
	return ""
}

func blockRule(b NodeBlock) string {
	switch {
	case strings.TrimSpace(b.Node) == "" || b.Node != strings.TrimSpace(b.Node):
		return fmt.Sprintf("node name %q is empty or has surrounding spaces", b.Node)
	case b.At.IsZero():
		return "no block time"
	}
	return ""
}

// crlRule is the first rule c breaks, or "": its DER must parse and say
// what the record says.
func crlRule(c CRLRecord) string {
	if !isFingerprint(c.Issuer) {
		return fmt.Sprintf("issuer %q is not a hex SHA-256 fingerprint", c.Issuer)
	}
	want, err := NewCRLRecord(c.Issuer, c.DER)
	switch {
	case err != nil:
		return err.Error()
	case c.Number == nil || c.Number.Cmp(want.Number) != 0:
		return fmt.Sprintf("number %s is not the CRL's %s", serialText(c.Number), want.Number)
	case !c.ThisUpdate.Equal(want.ThisUpdate) || !c.NextUpdate.Equal(want.NextUpdate):
		return "thisUpdate or nextUpdate is not the CRL's"
	case !want.NextUpdate.After(want.ThisUpdate):
		return "nextUpdate is not after thisUpdate"
	}
	return ""
}

func validReason(code int) bool {
	return code >= 0 && code <= 10 && code != 7 && code != 8
}

func isFingerprint(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func revocationKey(issuer string, serial *big.Int) string {
	return issuer + "/" + serial.Text(16)
}

// serialText is serial in hex, as openssl prints it; "none" for nil.
func serialText(serial *big.Int) string {
	if serial == nil {
		return "none"
	}
	return strings.ToUpper(serial.Text(16))
}
