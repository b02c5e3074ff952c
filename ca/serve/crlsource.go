package serve

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/ca/trust/trustprom"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/signer"
)

// DefaultCRLPoll is how often a backend that keeps its own CRLs (Vault
// PKI) is read for them when publishing CRLs: a revocation made there
// (meshca revoke --signer vault) is published within it.
const DefaultCRLPoll = 15 * time.Second

// crlSource keeps be.crl on the CRLs a backend keeps itself
// (signer.Revoker.CRLs), read every interval and whenever the CA state in
// service changes (kick). Their version is the CA state's in service, so
// that the publishers' Lease record takes them as it takes the trust
// bundle; a new read replaces them only when it has CRLs: while the
// backend fails, or answers none, the last ones stay published.
type crlSource struct {
	be       *backend
	src      signer.Revoker
	interval time.Duration
	metrics  *trustprom.CRLSource
	changed  func() // tells the publishers
	now      func() time.Time
	log      *slog.Logger
	kick     chan struct{}
	// revoked is the serials the CRLs last taken list (hex), which the
	// server refuses to renew by certificate as it does the CA state's.
	revoked atomic.Pointer[map[string]bool]
}

// revokedSerial reports whether the backend's CRLs last read list serial.
func (s *crlSource) revokedSerial(serial string) bool {
	r := s.revoked.Load()
	return r != nil && (*r)[serial]
}

// listed is the serials ders list, hex; nil when one does not parse.
func listed(ders [][]byte) map[string]bool {
	out := map[string]bool{}
	for _, der := range ders {
		l, err := x509.ParseRevocationList(der)
		if err != nil {
			return nil
		}
		for _, e := range l.RevokedCertificateEntries {
			out[e.SerialNumber.Text(16)] = true
		}
	}
	return out
}

// covers refuses CRLs that leave out the CA that signs the leaves
// (signing), or, when signing is an intermediate, the CA over it: a
// verifier that checks the whole chain with unknown status refused
// (ztunnel) would refuse every certificate meshca issues, where
// publishing no CRL only leaves revocation unchecked. signing nil
// (pinned trust anchors): not known, not checked.
func covers(backend string, ders [][]byte, signing *x509.Certificate) error {
	if signing == nil {
		return nil
	}
	byName := map[string]bool{}
	for _, der := range ders {
		l, err := x509.ParseRevocationList(der)
		if err != nil {
			return signer.Errorf(backend, signer.KindInternal, "a CRL does not parse: %v", err)
		}
		byName[string(l.RawIssuer)] = true
	}
	if !byName[string(signing.RawSubject)] {
		return signer.Errorf(backend, signer.KindRefused, "no CRL of %q, which signs the certificates: "+
			"publishing the others would have ztunnel refuse them all (docs/backends.md)", signing.Subject)
	}
	if !bytes.Equal(signing.RawIssuer, signing.RawSubject) && !byName[string(signing.RawIssuer)] {
		return signer.Errorf(backend, signer.KindRefused, "no CRL of %q, which signs the intermediate %q: "+
			"publishing the others would have ztunnel refuse every certificate under it; put its issuer in the same PKI mount (docs/backends.md)",
			signing.Issuer, signing.Subject)
	}
	return nil
}

func newCRLSource(be *backend, src signer.Revoker, interval time.Duration, metrics *trustprom.CRLSource, log *slog.Logger) *crlSource {
	if interval <= 0 {
		interval = DefaultCRLPoll
	}
	return &crlSource{be: be, src: src, interval: interval, metrics: metrics, changed: func() {}, now: time.Now, log: log,
		kick: make(chan struct{}, 1)}
}

// stateCRLs stores the CRLs of s, at version v, to publish, unless a
// backend's own (crlSource) are published in their place.
func (be *backend) stateCRLs(s *keymgr.State, v trust.BundleVersion) {
	if be.crlSource == nil {
		be.crl.Store(&trust.Bundle{PEM: stateCRLs(s), Version: v})
	}
}

// Kick asks for a read now.
func (s *crlSource) Kick() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Run reads the CRLs until ctx ends.
func (s *crlSource) Run(ctx context.Context) error {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		s.read(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-s.kick:
		}
	}
}

// read reads the CRLs once and, when they or the state's version
// changed, stores them and tells the publishers.
func (s *crlSource) read(ctx context.Context) {
	ders, err := s.src.CRLs(ctx)
	if err == nil && len(ders) == 0 {
		err = signer.Errorf(s.be.name, signer.KindInternal, "no CRL")
	}
	if r := listed(ders); err == nil && r != nil {
		// Enforced on renewal even when, below, not published.
		s.revoked.Store(&r)
	}
	if err == nil && s.be.signing != nil {
		err = covers(s.be.name, ders, s.be.signing())
	}
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		s.metrics.Read(trustprom.CRLSourceError, s.now())
		published := "none published yet"
		if old := s.be.crl.Load(); old != nil && len(old.PEM) > 0 {
			published = "the last ones read stay published"
		}
		s.log.Warn("the signing backend's CRLs not taken; "+published, "backend", s.be.name, "error", err)
		return
	}
	s.metrics.Read(trustprom.CRLSourceOK, s.now())
	var buf bytes.Buffer
	for _, der := range ders {
		_ = pem.Encode(&buf, &pem.Block{Type: "X509 CRL", Bytes: der})
	}
	b := &trust.Bundle{PEM: buf.Bytes()}
	if v := s.be.version.Load(); v != nil {
		b.Version = *v
	}
	if old := s.be.crl.Load(); old != nil && bytes.Equal(old.PEM, b.PEM) && old.Version == b.Version {
		return
	}
	s.be.crl.Store(b)
	s.log.Info("the signing backend's CRLs read", "backend", s.be.name, "crls", len(ders), "sequence", b.Version.Sequence)
	s.changed()
}
