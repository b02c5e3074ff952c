package ca

import (
	"bytes"
	"crypto/x509"
	"fmt"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/signer"
	"google.golang.org/grpc/codes"
)

// NodeBlocks answers whether a node is blocked by a revocation (meshca
// revoke --node): its proxy then gets no new certificate. The server asks
// on every request of a node proxy, so an implementation answers from
// memory (the CA state it follows), never by a call.
type NodeBlocks interface {
	NodeBlocked(node string) (keymgr.NodeBlock, bool)
}

// reasonNodeBlocked is the refusal of a blocked node's proxy.
const reasonNodeBlocked = "node_blocked"

// checkNodeBlock refuses a certificate asked for from a blocked node:
// through its proxy, or by a caller whose token is bound to a Pod on it
// (the keys and tokens of a stolen node's Pods are the thief's).
func (s *Server) checkNodeBlock(d Decision, c *Caller) error {
	node, who := d.ProxyNode, "its proxy"
	if node == "" && c != nil {
		node, who = c.Node, "a caller bound to a Pod on it"
	}
	if node == "" || s.c.NodeBlocks == nil {
		return nil
	}
	b, ok := s.c.NodeBlocks.NodeBlocked(node)
	if !ok {
		return nil
	}
	at := b.At.UTC().Format(time.RFC3339)
	return refuse(codes.PermissionDenied, reasonNodeBlocked,
		fmt.Sprintf("node %s is blocked by a revocation since %s; an operator lifts it with meshca revoke --node %s --undo", node, at, node),
		fmt.Errorf("node %s blocked at %s by %q (reason %q); %s asked for %s", node, at, b.By, b.Reason, who, d.ID))
}

// leafIssuer is the ID (keymgr.Fingerprint) of the CA certificate that
// signed res.Leaf, once its chain verified to roots: what a revocation
// of the leaf names as its issuer. Empty when it cannot be told without
// doubt.
func leafIssuer(res *signer.Response, roots []*x509.Certificate) string {
	leaf := res.Leaf
	if res.VerifiedIssuer != nil {
		return keymgr.Fingerprint(res.VerifiedIssuer)
	}
	if len(res.Intermediates) > 0 {
		if bytes.Equal(leaf.RawIssuer, res.Intermediates[0].RawSubject) {
			return keymgr.Fingerprint(res.Intermediates[0])
		}
		return ""
	}
	var match []*x509.Certificate
	for _, r := range roots {
		if bytes.Equal(leaf.RawIssuer, r.RawSubject) {
			match = append(match, r)
		}
	}
	if len(match) == 1 {
		return keymgr.Fingerprint(match[0])
	}
	// Roots that share a subject (generated ones of a rotation): the
	// signature tells them apart.
	for _, r := range match {
		if leaf.CheckSignatureFrom(r) == nil {
			return keymgr.Fingerprint(r)
		}
	}
	return ""
}
