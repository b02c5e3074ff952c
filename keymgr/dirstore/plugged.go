package dirstore

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
)

// PluggedReason is the history reason of the authorities a PluggedDir
// makes of its directory.
const PluggedReason = "plugged-in CA directory"

// ErrPluggedReadOnly is PluggedDir's answer to Save.
var ErrPluggedReadOnly = errors.New("keymgr: a plugged-in CA directory is read-only: its owner (an operator, cert-manager) writes it; rotate with a CA state to let meshca write")

// PluggedDir is a plugged-in CA directory (keymgr.LoadCACerts' layouts:
// Istio's cacerts, or a cert-manager Certificate's tls.crt, tls.key and
// ca.crt) as a read-only keymgr.StateStore, so that a keymgr.Follower keeps a
// server on it while its owner renews it: the active authority signs with the
// directory's CA, every other root of its bundle is a previous, external one.
// The keymgr.Version is a digest of the files; the Sequence starts at 1 and
// grows whenever the bundle changes. Each Load checks the directory as
// keymgr.LoadCACerts does at that time; a directory caught halfway through a
// change (a key that does not match its certificate) fails to load, and the
// keymgr.Follower keeps the last good CA until the next look.
type PluggedDir struct {
	Dir string
	// Now is the clock; time.Now when nil.
	Now func() time.Time

	mu    sync.Mutex
	roots []*x509.Certificate // the bundle of the last Load
	seq   uint64
}

// pluggedFiles are the files of both layouts; the digest covers those present.
var pluggedFiles = []string{keymgr.FileCACert, keymgr.FileCAKey, keymgr.FileCertChain, keymgr.FileRootCert, keymgr.FileTLSCert, keymgr.FileTLSKey, keymgr.FileTLSCA}

// Load implements keymgr.StateStore.
func (p *PluggedDir) Load(context.Context) (*keymgr.State, keymgr.Version, error) {
	v, err := p.digest()
	if err != nil {
		return nil, "", err
	}
	now := time.Now()
	if p.Now != nil {
		now = p.Now()
	}
	a, err := keymgr.LoadCACerts(p.Dir, now)
	if err != nil {
		return nil, "", err
	}
	// Its owner may have been writing it meanwhile: what was read must be
	// what the version names.
	if again, err := p.digest(); err != nil || again != v {
		return nil, "", &keymgr.FileError{Path: p.Dir, Err: errors.New("changed while it was read; read again at the next look")}
	}
	s, err := stateOfAuthority(a, a.Cert.NotBefore.UTC(), PluggedReason, false)
	if err != nil {
		return nil, "", &keymgr.FileError{Path: p.Dir, Err: err}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if bundle := s.Bundle(); p.seq == 0 || !certs.SameCerts(bundle, p.roots) {
		p.roots, p.seq = bundle, p.seq+1
	}
	s.Sequence = p.seq
	return s, v, nil
}

// AnyLineage says the directory's states may change lineage in service
// (keymgr.Follower): its owner replaces its authority at will.
func (p *PluggedDir) AnyLineage() bool { return true }

// Save implements StateStore: it never writes.
func (p *PluggedDir) Save(context.Context, *keymgr.State, keymgr.Version) (keymgr.Version, error) {
	return "", ErrPluggedReadOnly
}

// digest is the keymgr.Version of the directory's files as they are now.
func (p *PluggedDir) digest() (keymgr.Version, error) {
	h := sha256.New()
	for _, name := range pluggedFiles {
		b, err := os.ReadFile(filepath.Join(p.Dir, name))
		switch {
		case errors.Is(err, os.ErrNotExist):
			continue
		case err != nil:
			return "", &keymgr.FileError{Path: filepath.Join(p.Dir, name), Err: err}
		}
		fmt.Fprintf(h, "%s %d\n", name, len(b))
		h.Write(b)
	}
	return keymgr.Version(hex.EncodeToString(h.Sum(nil))[:16]), nil
}

// PluggedTarget is the keymgr.Follower's keymgr.Target for a PluggedDir: a
// keymgr.Manager that takes a new CA from the directory only when its root is
// one the keymgr.Manager already serves. A root that is new to workloads must
// first be served beside the old one (added to root-cert.pem or ca.crt) for
// half a leaf's lifetime before a CA under it signs, and no state records when
// it was added: that timing is the directory's owner's, as with istiod.
type PluggedTarget struct {
	Manager *keymgr.Manager
}

// Use implements keymgr.Target.
func (t PluggedTarget) Use(s *keymgr.State, now time.Time) error {
	active := s.Active()
	if active == nil {
		return errors.New("keymgr: the plugged-in CA directory has no signing CA")
	}
	if cur := t.Manager.Authority(); cur != nil && !containsCert(cur.Roots, active.Root) {
		return fmt.Errorf("keymgr: the plugged-in CA %q signs under root %q, which workloads do not trust yet: "+
			"serve that root beside the current one (root-cert.pem or ca.crt) for half a leaf's lifetime first, then switch the signing CA",
			active.Cert.Subject, active.Root.Subject)
	}
	return t.Manager.Use(s, now)
}
