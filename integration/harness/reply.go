package harness

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/signer"
)

// CheckReply checks a CreateCertificate reply from any client (leaf,
// intermediates, then the bundle as one PEM) as CheckChain does, without
// the key.
func CheckReply(tb testing.TB, reply []string) {
	tb.Helper()
	chain, roots, err := ParseReply(reply)
	if err != nil {
		tb.Errorf("harness: %v", err)
		return
	}
	CheckChain(tb, chain, roots, nil)
}

// ParseReply parses a CreateCertificate reply into the leaf and its
// intermediates, and the bundle's roots, without checking them.
func ParseReply(reply []string) (chain, roots []*x509.Certificate, err error) {
	if len(reply) < 2 {
		return nil, nil, fmt.Errorf("CreateCertificate reply of %d elements, want a leaf and the bundle at least", len(reply))
	}
	for i, p := range reply[:len(reply)-1] {
		certs, err := pemutil.ParseCertificates([]byte(p))
		if err != nil || len(certs) != 1 {
			return nil, nil, fmt.Errorf("CreateCertificate reply: element %d is not one PEM certificate: %v", i, err)
		}
		chain = append(chain, certs[0])
	}
	roots, err = pemutil.ParseCertificates([]byte(reply[len(reply)-1]))
	if err != nil {
		return nil, nil, fmt.Errorf("CreateCertificate reply: bundle: %w", err)
	}
	return chain, roots, nil
}

// ServingChain dials addr with TLS as a client of meshca does (server
// name, roots) and returns the chain the server presented. Without roots
// it accepts any chain: it reads, it does not verify.
func ServingChain(addr, serverName string, roots *x509.CertPool) ([]*x509.Certificate, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName, RootCAs: roots, NextProtos: []string{"h2"},
		InsecureSkipVerify: roots == nil}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, tc)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates, nil
}

// LintedSigner wraps a signer under test: every certificate it issues
// under a goes through CheckChain against a's roots.
func LintedSigner(tb testing.TB, a *keymgr.Authority, s signer.Signer) signer.Signer {
	return &lintedSigner{tb: tb, roots: a.Roots, s: s}
}

type lintedSigner struct {
	tb    testing.TB
	roots []*x509.Certificate
	s     signer.Signer
}

func (l *lintedSigner) Sign(ctx context.Context, req *signer.Request) (*signer.Response, error) {
	resp, err := l.s.Sign(ctx, req)
	if err == nil {
		CheckChain(l.tb, append([]*x509.Certificate{resp.Leaf}, resp.Intermediates...), l.roots, nil)
	}
	return resp, err
}
