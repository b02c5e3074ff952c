package keymgr

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"time"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr/upstream"
)

// EntryState is the entry of an encoded CA state that holds the document:
// every authority's certificates, phase and history, and the sequence.
// Each private key is an entry of its own (see KeyEntry).
const EntryState = "state.json"

// StateFormat is the newest format version of the state.json document,
// which this meshca reads with every older one. A document with a newer
// version, or with a field its version does not know, is refused: saving
// it again would silently drop what a newer meshca recorded.
//
// Version 1 names an authority by its root's fingerprint, so no two
// authorities share a root; version 2 names it by its signing
// certificate's, so intermediates rotate under one root. EncodeState
// writes version 1 while no two authorities share a root, so that a
// meshca that reads only version 1 (a replica not yet upgraded, or a
// rollback) still reads such a state; version 2 only once they do.
// Version 3 adds an authority's upstream and the entry of its root's key
// (meshca serve --upstream); EncodeState writes it only once an
// authority has one. Version 4 adds the revocations, node blocks and
// CRLs (revocation.go); EncodeState writes it only once the state holds
// any.
const StateFormat = 4

// stateFormatRootIDs is the format version whose ids are the roots';
// stateFormatShared, the first whose ids are the signing certificates';
// stateFormatUpstream, the first with upstreams; stateFormatRevocation,
// the first with revocations.
const (
	stateFormatRootIDs    = 1
	stateFormatShared     = 2
	stateFormatUpstream   = 3
	stateFormatRevocation = 4
)

// keyEntryHexLen is how many hex digits of the fingerprint name a key entry.
const keyEntryHexLen = 16

// EntryError says which entry of an encoded CA state is wrong and why.
type EntryError struct {
	Entry string
	Err   error
}

func (e *EntryError) Error() string {
	return fmt.Sprintf("keymgr: CA state entry %q: %v", e.Entry, e.Err)
}

func (e *EntryError) Unwrap() error { return e.Err }

// The state.json document.
type stateDoc struct {
	Format      int            `json:"format"`
	Sequence    uint64         `json:"sequence"`
	Authorities []authorityDoc `json:"authorities"`
	// Format 4.
	Revocations []revocationDoc `json:"revocations,omitempty"`
	Blocked     []blockDoc      `json:"blocked,omitempty"`
	CRLs        []crlDoc        `json:"crls,omitempty"`
}

type authorityDoc struct {
	// ID is the signing certificate's fingerprint (the root's in format
	// 1), for people reading the document; it must match.
	ID        string `json:"id"`
	Phase     Phase  `json:"phase"`
	External  bool   `json:"external,omitempty"`
	Generated bool   `json:"generated,omitempty"`
	Root      string `json:"root"`
	Cert      string `json:"cert"`
	Chain     string `json:"chain,omitempty"`
	// Key names the key entry; empty for an authority without a key.
	Key string `json:"key,omitempty"`
	// Upstream names where the root's key is, for an authority meshca
	// renews from an upstream; RootKey names the entry of the root's key
	// when the state keeps it (self), shared by the authorities under
	// that root. Format 3.
	Upstream           *upstream.Ref   `json:"upstream,omitempty"`
	RootKey            string          `json:"rootKey,omitempty"`
	LatestLeafNotAfter string          `json:"latestLeafNotAfter,omitempty"`
	LongestLeafTTL     string          `json:"longestLeafTTL,omitempty"`
	History            []transitionDoc `json:"history"`
}

type transitionDoc struct {
	To     Phase  `json:"to"`
	At     string `json:"at"`
	Reason string `json:"reason,omitempty"`
	Forced bool   `json:"forced,omitempty"`
}

// EncodeState returns s as the entries of a Kubernetes Secret or the
// files of a state directory: EntryState, and one PKCS#8 PEM private key
// per authority that has one (KeyEntry of its Cert). A retired
// authority's key is never written: retiring destroys it. Times are
// RFC 3339 in UTC, to the nanosecond. EncodeState refuses a state it
// could not decode again: an authority without a root or signing
// certificate, a key that does not match its certificate, two authorities
// with one signing certificate.
func EncodeState(s *State) (map[string][]byte, error) {
	if s == nil {
		return nil, errors.New("keymgr: encode CA state: no state")
	}
	doc := stateDoc{Format: encodeFormat(s), Sequence: s.Sequence, Authorities: make([]authorityDoc, 0, len(s.Authorities))}
	out := map[string][]byte{}
	ids := map[string]int{}
	for i, r := range s.Authorities {
		ad, keys, err := encodeAuthority(r)
		if err != nil {
			return nil, fmt.Errorf("keymgr: encode CA state: authority %d: %w", i+1, err)
		}
		if doc.Format == stateFormatRootIDs {
			ad.ID = r.RootID()
		}
		if j, dup := ids[ad.ID]; dup {
			return nil, fmt.Errorf("keymgr: encode CA state: authorities %d and %d have the same signing certificate %.16s", j+1, i+1, r.ID())
		}
		ids[ad.ID] = i
		for name, key := range keys {
			// Authorities under one root share its key's entry; the
			// entry of a root that signs itself is that key's too.
			if old, dup := out[name]; dup && !bytes.Equal(old, key) {
				return nil, fmt.Errorf("keymgr: encode CA state: authority %d: key entry %s is already taken", i+1, name)
			}
			out[name] = key
		}
		doc.Authorities = append(doc.Authorities, ad)
	}
	if err := encodeRevocations(s, &doc); err != nil {
		return nil, fmt.Errorf("keymgr: encode CA state: %w", err)
	}
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("keymgr: encode CA state: %w", err)
	}
	out[EntryState] = append(data, '\n')
	return out, nil
}

// encodeFormat is the oldest format that can hold s: 1 while no two
// authorities share a root, 3 once one is renewed from an upstream, 4
// once it holds revocations, node blocks or CRLs.
func encodeFormat(s *State) int {
	if len(s.Revocations) > 0 || len(s.Blocked) > 0 || len(s.CRLs) > 0 {
		return stateFormatRevocation
	}
	format := stateFormatRootIDs
	roots := map[string]bool{}
	for _, r := range s.Authorities {
		switch {
		case r == nil || r.Root == nil:
		case r.Renewed() || r.RootKey != nil:
			return stateFormatUpstream
		case roots[r.RootID()]:
			format = stateFormatShared
		}
		if r != nil && r.Root != nil {
			roots[r.RootID()] = true
		}
	}
	return format
}

// encodeAuthority is r's document and its key entries.
func encodeAuthority(r *AuthorityRecord) (authorityDoc, map[string][]byte, error) {
	switch {
	case r == nil:
		return authorityDoc{}, nil, errors.New("no record")
	case r.Root == nil:
		return authorityDoc{}, nil, errors.New("no root certificate")
	case r.Cert == nil:
		return authorityDoc{}, nil, errors.New("no signing certificate (for a root authority, Cert is Root)")
	case !validPhase(r.Phase):
		return authorityDoc{}, nil, fmt.Errorf("unknown phase %q", r.Phase)
	case r.LongestLeafTTL < 0:
		return authorityDoc{}, nil, fmt.Errorf("negative longest leaf TTL %v", r.LongestLeafTTL)
	}
	ad := authorityDoc{
		ID:        r.ID(),
		Phase:     r.Phase,
		External:  r.External,
		Generated: r.Generated,
		Root:      string(pemutil.EncodeCertificates(r.Root)),
		Cert:      string(pemutil.EncodeCertificates(r.Cert)),
		Chain:     string(pemutil.EncodeCertificates(r.Chain...)),
		History:   make([]transitionDoc, 0, len(r.History)),
	}
	if err := checkAuthorityPath(r); err != nil {
		return authorityDoc{}, nil, err
	}
	if !r.LatestLeafNotAfter.IsZero() {
		ad.LatestLeafNotAfter = formatTime(r.LatestLeafNotAfter)
	}
	if r.LongestLeafTTL > 0 {
		ad.LongestLeafTTL = r.LongestLeafTTL.String()
	}
	for j, t := range r.History {
		if !validPhase(t.To) {
			return authorityDoc{}, nil, fmt.Errorf("history %d: unknown phase %q", j+1, t.To)
		}
		ad.History = append(ad.History, transitionDoc{To: t.To, At: formatTime(t.At), Reason: t.Reason, Forced: t.Forced})
	}
	if r.Renewed() {
		ref := r.Upstream
		ad.Upstream = &ref
	}
	keys := map[string][]byte{}
	if r.Phase == PhaseRetired {
		return ad, keys, nil
	}
	var err error
	if ad.Key, err = encodeKey(keys, r.Key, r.Cert); err != nil {
		return authorityDoc{}, nil, fmt.Errorf("the private key: %w", err)
	}
	if ad.RootKey, err = encodeKey(keys, r.RootKey, r.Root); err != nil {
		return authorityDoc{}, nil, fmt.Errorf("root key: %w", err)
	}
	return ad, keys, nil
}

// DecodeState parses entries written by EncodeState. It is strict, since
// anyone allowed to edit the Secret or the directory can hand it anything:
// an unknown format version or field, trailing data, a PEM entry that does
// not parse, a root that is not a self-signed CA, a signing certificate
// that does not chain to its root, a key entry that is missing, not named
// for its certificate, or does not match it, and an entry nothing refers
// to are all refused with an *EntryError naming the entry.
func DecodeState(entries map[string][]byte) (*State, error) {
	data, present := entries[EntryState]
	doc, err := parseStateDoc(data, present)
	if err != nil {
		return nil, &EntryError{Entry: EntryState, Err: err}
	}
	s := &State{Sequence: doc.Sequence, Authorities: make([]*AuthorityRecord, 0, len(doc.Authorities))}
	keys := keyEntries{entries: entries, used: map[string]usedKey{EntryState: {}}}
	ids := map[string]int{}
	for i, ad := range doc.Authorities {
		r, err := decodeAuthority(ad, doc.Format)
		if err != nil {
			return nil, &EntryError{Entry: EntryState, Err: fmt.Errorf("authority %d (%.16s): %w", i+1, ad.ID, err)}
		}
		if j, dup := ids[ad.ID]; dup {
			return nil, &EntryError{Entry: EntryState, Err: fmt.Errorf("authorities %d and %d have the same %s %.16s", j+1, i+1, idNames(doc.Format), ad.ID)}
		}
		ids[ad.ID] = i
		if r.Key, err = keys.decode(ad.Key, r.Cert); err != nil {
			return nil, keys.entryError(ad.Key, i, ad.ID, err)
		}
		if r.RootKey, err = keys.decode(ad.RootKey, r.Root); err != nil {
			return nil, keys.entryError(ad.RootKey, i, ad.ID, err)
		}
		s.Authorities = append(s.Authorities, r)
	}
	if err := decodeRevocations(doc, s); err != nil {
		return nil, &EntryError{Entry: EntryState, Err: err}
	}
	for name := range entries {
		if _, used := keys.used[name]; !used {
			return nil, &EntryError{Entry: name, Err: errors.New("no authority of the CA state refers to it")}
		}
	}
	return s, nil
}

// parseStateDoc parses the state.json document strictly.
func parseStateDoc(data []byte, present bool) (*stateDoc, error) {
	if !present {
		return nil, errors.New("missing")
	}
	if err := exactKeys(data, reflect.TypeFor[stateDoc]()); err != nil {
		return nil, fmt.Errorf("not a CA state document: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var doc stateDoc
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("not a CA state document: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("data follows the CA state document")
	}
	if doc.Format < stateFormatRootIDs || doc.Format > StateFormat {
		return nil, fmt.Errorf("format version %d is not supported (this meshca reads versions %d to %d)", doc.Format, stateFormatRootIDs, StateFormat)
	}
	return &doc, nil
}

// idNames says what the ids of a document of format name.
func idNames(format int) string {
	if format == stateFormatRootIDs {
		return "root"
	}
	return "signing certificate"
}

func decodeAuthority(ad authorityDoc, format int) (*AuthorityRecord, error) {
	r := &AuthorityRecord{Phase: ad.Phase, External: ad.External, Generated: ad.Generated}
	if !validPhase(ad.Phase) {
		return nil, fmt.Errorf("unknown phase %q", ad.Phase)
	}
	var err error
	if r.Root, err = decodeOneCert("root", ad.Root); err != nil {
		return nil, err
	}
	if r.Cert, err = decodeOneCert("cert", ad.Cert); err != nil {
		return nil, err
	}
	if ad.Chain != "" {
		if r.Chain, err = pemutil.ParseCertificates([]byte(ad.Chain)); err != nil {
			return nil, fmt.Errorf("chain: %w", err)
		}
	}
	switch id := r.ID(); {
	case format == stateFormatRootIDs && ad.ID != r.RootID():
		return nil, fmt.Errorf("id %q is not the root's fingerprint %s", ad.ID, r.RootID())
	case format != stateFormatRootIDs && ad.ID != id:
		return nil, fmt.Errorf("id %q is not the signing certificate's fingerprint %s", ad.ID, id)
	}
	if err := checkAuthorityPath(r); err != nil {
		return nil, err
	}
	switch {
	case (ad.Key != "" || ad.RootKey != "") && ad.Phase == PhaseRetired:
		return nil, errors.New("a retired authority has a key entry: its key must be destroyed")
	case ad.Key != "" && ad.Key != KeyEntry(r.Cert):
		return nil, fmt.Errorf("key entry %q is not the one named for its signing certificate, %s", ad.Key, KeyEntry(r.Cert))
	case ad.RootKey != "" && ad.RootKey != KeyEntry(r.Root):
		return nil, fmt.Errorf("root key entry %q is not the one named for its root, %s", ad.RootKey, KeyEntry(r.Root))
	case format < stateFormatUpstream && (ad.Upstream != nil || ad.RootKey != ""):
		return nil, fmt.Errorf("upstream and rootKey are fields of format %d, not %d", stateFormatUpstream, format)
	case ad.Upstream != nil && ad.Upstream.Type == "":
		return nil, errors.New("upstream: the type is empty")
	case ad.Upstream != nil:
		r.Upstream = *ad.Upstream
	}
	if ad.LatestLeafNotAfter != "" {
		if r.LatestLeafNotAfter, err = parseTime(ad.LatestLeafNotAfter); err != nil {
			return nil, fmt.Errorf("latestLeafNotAfter: %w", err)
		}
	}
	if ad.LongestLeafTTL != "" {
		if r.LongestLeafTTL, err = time.ParseDuration(ad.LongestLeafTTL); err != nil || r.LongestLeafTTL < 0 {
			return nil, fmt.Errorf("longestLeafTTL %q is not a duration of zero or more", ad.LongestLeafTTL)
		}
	}
	for j, td := range ad.History {
		t := Transition{To: td.To, Reason: td.Reason, Forced: td.Forced}
		if !validPhase(td.To) {
			return nil, fmt.Errorf("history %d: unknown phase %q", j+1, td.To)
		}
		if t.At, err = parseTime(td.At); err != nil {
			return nil, fmt.Errorf("history %d: %w", j+1, err)
		}
		r.History = append(r.History, t)
	}
	return r, nil
}

// checkAuthorityPath checks, at no particular time, that Root is a
// self-signed CA and Cert chains up to it through Chain.
func checkAuthorityPath(r *AuthorityRecord) error {
	if err := checkRoot(r.Root); err != nil {
		return fmt.Errorf("root: %w", err)
	}
	path := append([]*x509.Certificate{r.Cert}, r.Chain...)
	if r.SignsWithRoot() {
		if len(r.Chain) != 0 {
			return errors.New("chain: a root authority has no intermediates")
		}
		return nil
	}
	for i, c := range path {
		parent := r.Root
		if i+1 < len(path) {
			parent = path[i+1]
		}
		if err := c.CheckSignatureFrom(parent); err != nil {
			return fmt.Errorf("certificate %q is not signed by %q: %w", c.Subject, parent.Subject, err)
		}
	}
	return nil
}

func decodeOneCert(field, s string) (*x509.Certificate, error) {
	certs, err := pemutil.ParseCertificates([]byte(s))
	switch {
	case err != nil:
		return nil, fmt.Errorf("%s: %w", field, err)
	case len(certs) != 1:
		return nil, fmt.Errorf("%s: holds %d certificates, want 1", field, len(certs))
	}
	return certs[0], nil
}

func validPhase(p Phase) bool {
	switch p {
	case PhasePrepared, PhaseActive, PhasePrevious, PhaseRetired:
		return true
	}
	return false
}

func formatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func parseTime(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("time %q is not RFC 3339", s)
	}
	return t.UTC(), nil
}
