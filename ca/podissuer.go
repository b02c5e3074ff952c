package ca

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/meshca/meshca/ca/limit"
	"github.com/meshca/meshca/ca/podcert"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/signer"
	"github.com/prometheus/client_golang/prometheus"
)

// EventPodCertificate is one PodCertificateRequest answered: issued,
// denied or failed.
const EventPodCertificate = "pod_certificate"

// DecisionFailed is a PodCertificateRequest the CA could not answer with a
// certificate (its Failed condition).
const DecisionFailed = "failed"

// AuthnPodCertificateRequest is the Authn of a pod certificate's audit
// event: the kubelet of the node asked through the apiserver.
const AuthnPodCertificateRequest = "podcertificaterequest"

// PodIssuer issues the certificates of ca/podcert with the server's key
// policy, signer, chain verification, audit sink and metrics: steps 4 to
// 7 of a CreateCertificate, for a Pod the PodCertificateRequest controller
// has checked.
type PodIssuer struct {
	s         *Server
	decisions *prometheus.CounterVec
}

var _ podcert.Issuer = (*PodIssuer)(nil)

// NewPodIssuer registers its counter with reg.
func NewPodIssuer(s *Server, reg prometheus.Registerer) *PodIssuer {
	p := &PodIssuer{s: s, decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "meshca_pod_certificate_requests_total",
		Help: "PodCertificateRequests answered, by condition (issued, denied, failed) and precise reason; a certificate signed but not delivered (not_delivered) or refused before a retry (issued_chain_invalid, ...) counts as failed.",
	}, []string{"decision", "reason"})}
	reg.MustRegister(p.decisions)
	return p
}

// IssuePod implements podcert.Issuer: the node's budget and an issuance
// slot (admit), the key policy (the apiserver has verified the stub's
// signature; it is checked again, after the key), the stub as a kubelet
// makes it (csr.CheckStub), the signer within the request timeout, and
// the issued chain verified to the trust bundle as the gRPC path
// verifies it. A certificate signed but
// not verified is returned in a *podcert.SignedError, for its serial.
func (p *PodIssuer) IssuePod(ctx context.Context, r *podcert.IssueRequest) (*podcert.Issued, error) {
	s := p.s
	if s.c.NodeBlocks != nil {
		// A blocked node's kubelet gets no certificate for its Pods, as
		// its proxy gets none: both act for the node.
		if b, blocked := s.c.NodeBlocks.NodeBlocked(r.Node); blocked {
			return nil, podcert.NodeBlocked(r.Node, b.At)
		}
	}
	release, err := p.admit(r.Node)
	if err != nil {
		return nil, err
	}
	defer release()
	req, err := csr.ParseFor(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: r.StubPKCS10}), &s.c.Policy.Keys)
	if err != nil {
		return nil, err
	}
	if err := csr.CheckStub(req); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.c.RequestTimeout)
	defer cancel()
	res, err := s.c.Signer.Sign(ctx, &signer.Request{CSR: req, ID: r.ID, TTL: r.Lifetime, Lifetime: r.Lifetime, Usages: csr.WorkloadUsages(req.PublicKey)})
	if err != nil {
		return nil, err
	}
	// From here on a certificate exists: a failure carries it, so that
	// its serial is audited (podcert.SignedError), as the gRPC path does.
	bundle, err := s.c.Bundles.GetX509BundleForTrustDomain(s.c.TrustDomain)
	if err != nil {
		return nil, &podcert.SignedError{Leaf: res.Leaf, Reason: "no_trust_bundle",
			Err: signer.Errorf(s.c.SignerName, signer.KindUnavailable, "no trust bundle yet: %w", err)}
	}
	got, out, err := s.issued.verify(s.issued.forBundle(bundle), res, s.c.Now())
	switch {
	case err != nil:
		return nil, &podcert.SignedError{Leaf: res.Leaf, Reason: "issued_chain_invalid",
			Err: fmt.Errorf("ca: issued certificate failed verification: %w", err)}
	case got != r.ID:
		return nil, &podcert.SignedError{Leaf: res.Leaf, Reason: "issued_wrong_identity",
			Err: fmt.Errorf("ca: issued certificate failed verification: issued %s, authorized %s", got, r.ID)}
	}
	// out is the leaf, the intermediates, then the bundle: the Pod mounts
	// the roots from the ClusterTrustBundle.
	return &podcert.Issued{Leaf: res.Leaf, ChainPEM: strings.Join(out[:len(out)-1], ""), Issuer: leafIssuer(res, bundle.X509Authorities())}, nil
}

// admit takes a turn of the node proxy budget for the request's node and
// an issuance slot, as CreateCertificate takes its caller's turn and a
// slot: a kubelet asks for its Pods' certificates as a ztunnel does, and
// the Pod certificates share the CA's concurrency with the gRPC
// requests. Over either, a *podcert.Busy says when to retry, counted in
// meshca_rate_limited_total as the gRPC path counts its refusals.
//
// The slot is taken first: the controller retries by itself, and a CA
// at its concurrency limit must not spend the nodes' rate tokens.
func (p *PodIssuer) admit(node string) (func(), error) {
	s := p.s
	releaseSlot, err := s.limits.TakeSlot()
	if err != nil {
		return nil, p.busy(err)
	}
	leave, err := s.limits.AdmitNode(node)
	if err != nil {
		releaseSlot()
		return nil, p.busy(err)
	}
	return func() { releaseSlot(); leave() }, nil
}

func (p *PodIssuer) busy(err error) error {
	var le *limit.ExhaustedError
	if !errors.As(err, &le) {
		return err
	}
	p.s.c.Metrics.rateLimited.WithLabelValues(le.Reason).Inc()
	return &podcert.Busy{RetryAfter: le.RetryAfter, Reason: le.Reason, Err: err}
}

// RecordPod implements podcert.Issuer: one audit event and one count per
// answer.
func (p *PodIssuer) RecordPod(ctx context.Context, d *podcert.Decision) {
	decision := strings.ToLower(d.Condition) // DecisionIssued, DecisionDenied or DecisionFailed
	p.decisions.WithLabelValues(decision, d.Reason).Inc()
	r := d.Request
	e := &AuditEvent{Time: p.s.c.Now(), Event: EventPodCertificate, Decision: decision,
		Message: "pod certificate request", RequestID: r.Namespace + "/" + r.Name,
		Caller: "system:node:" + string(r.Spec.NodeName), Authn: AuthnPodCertificateRequest,
		Pod: r.Namespace + "/" + r.Spec.PodName, Node: string(r.Spec.NodeName), Requested: r.Spec.SignerName,
		Reason: d.Reason, Backend: p.s.c.SignerName, Latency: d.Latency}
	if d.Condition != "Issued" {
		e.Detail = d.Detail
	}
	if !d.Identity.IsZero() {
		e.Identity = d.Identity.String()
	}
	if d.Leaf != nil {
		e.Serial, e.NotAfter, e.Issuer = d.Leaf.SerialNumber.Text(16), d.Leaf.NotAfter, d.Issuer
	}
	p.s.c.Audit.Audit(ctx, e)
}

// PodTTL is the longest certificate the server issues (its MaxTTL): the
// cap of a pod certificate's lifetime.
func (s *Server) PodTTL() time.Duration { return s.c.MaxTTL }
