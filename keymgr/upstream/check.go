package upstream

import (
	"crypto/x509"
	"fmt"
	"slices"
	"time"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/keymgr/certs"
)

// MaxSlack is the most an answer's NotAfter may differ from the one
// asked for: the upstream's clock, and the time the request took.
const MaxSlack = 5 * time.Minute

// MinSlack is the least slack: certificates hold times to the second,
// and the request takes time.
const MinSlack = 5 * time.Second

// Slack is how far an intermediate of lifetime ttl may end from now+ttl:
// a tenth of ttl, between MinSlack and MaxSlack, so that a short
// lifetime is held about as tightly as a long one.
func Slack(ttl time.Duration) time.Duration { return min(MaxSlack, max(MinSlack, ttl/10)) }

// CheckError is an upstream's answer that breaks a rule of Check.
type CheckError struct {
	// Rule says which, and how.
	Rule string
}

func (e *CheckError) Error() string { return "the signed intermediate is refused: " + e.Rule }

// Check holds an upstream's answer to req, at now, to the rules of a
// signing intermediate, whatever the upstream: a CA certificate of path
// length 0 with the keyCertSign and cRLSign usages, for the CSR's key,
// not self-signed, naming nothing but the trust domain's SPIFFE ID,
// with no extended key usage that would stop its leaves from being TLS
// clients and servers; valid now, ending ttl from now within Slack and
// never after its root nor after a certificate of its chain; chaining
// through resp.Chain to req.Root, whose path length constraints let it
// sign leaves; and req.Root in bundle, the trust bundle its leaves are
// verified against, when bundle is given. A refusal is an *Error of
// KindInternal wrapping a *CheckError.
func Check(req *Request, resp *Response, now time.Time, bundle []*x509.Certificate) error {
	if rule := checkRule(req, resp, now, bundle); rule != "" {
		return &Error{Upstream: req.Ref.Type, Kind: KindInternal, Err: &CheckError{Rule: rule}}
	}
	return nil
}

// checkRule is the first rule the answer breaks, or "".
func checkRule(req *Request, resp *Response, now time.Time, bundle []*x509.Certificate) string {
	if resp == nil || resp.Cert == nil {
		return "the upstream returned no certificate"
	}
	c := resp.Cert
	if rule := caRule(c); rule != "" {
		return rule
	}
	if rule := namesRule(c, req); rule != "" {
		return rule
	}
	switch {
	case !csr.SamePublicKey(c.PublicKey, req.CSR.PublicKey):
		return "it is not for the key of the CSR meshca sent"
	case certs.IsSelfSigned(c):
		return "it is self-signed: an intermediate is signed by the root"
	case slices.ContainsFunc(resp.Chain, func(x *x509.Certificate) bool { return x.Equal(req.Root) || x.Equal(c) }):
		return "its chain holds the root or the intermediate itself: it lists only the certificates between them"
	case len(bundle) > 0 && !slices.ContainsFunc(bundle, req.Root.Equal):
		return fmt.Sprintf("its root %q is not in the trust bundle", req.Root.Subject)
	}
	if rule := lifetimeRule(c, resp.Chain, req, now); rule != "" {
		return rule
	}
	return chainRule(c, resp.Chain, req.Root, now)
}

// caRule is the rule c breaks as a CA that signs leaves only, or "".
func caRule(c *x509.Certificate) string {
	switch {
	case !c.BasicConstraintsValid || !c.IsCA:
		return "it is not a CA (basicConstraints CA:true is missing)"
	case c.MaxPathLen != 0 || !c.MaxPathLenZero:
		return fmt.Sprintf("its path length is %s, want 0: it signs leaves, never another CA", pathLen(c))
	case c.KeyUsage&x509.KeyUsageCertSign == 0:
		return "it lacks the keyCertSign key usage"
	case c.KeyUsage&x509.KeyUsageCRLSign == 0:
		return "it lacks the cRLSign key usage"
	case len(c.ExtKeyUsage) > 0 && !slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageAny) &&
		(!slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageServerAuth) || !slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageClientAuth)):
		return "its extended key usages leave out serverAuth or clientAuth, which its leaves need"
	}
	return ""
}

func pathLen(c *x509.Certificate) string {
	if c.MaxPathLen < 0 || c.MaxPathLen == 0 && !c.MaxPathLenZero {
		return "unlimited"
	}
	return fmt.Sprint(c.MaxPathLen)
}

// namesRule is the rule c's names break, or "": none but the trust
// domain's SPIFFE ID.
func namesRule(c *x509.Certificate, req *Request) string {
	switch {
	case len(c.DNSNames)+len(c.IPAddresses)+len(c.EmailAddresses) > 0:
		return "it carries DNS, IP or email names: a signing intermediate names its trust domain alone"
	case len(c.URIs) > 1:
		return fmt.Sprintf("it carries %d URI names, want at most its trust domain's ID", len(c.URIs))
	case len(c.URIs) == 1 && (req.TrustDomain.IsZero() || c.URIs[0].String() != req.TrustDomain.IDString()):
		return fmt.Sprintf("its URI name %q is not the trust domain's ID %q", c.URIs[0], req.TrustDomain.IDString())
	}
	return ""
}

// lifetimeRule is the rule c's validity breaks, or "".
func lifetimeRule(c *x509.Certificate, chain []*x509.Certificate, req *Request, now time.Time) string {
	want, slack := now.Add(req.TTL), Slack(req.TTL)
	end := func(t time.Time) string { return t.UTC().Format(time.RFC3339) }
	switch {
	case c.NotAfter.After(req.Root.NotAfter):
		return fmt.Sprintf("it ends at %s, after its root (%s)", end(c.NotAfter), end(req.Root.NotAfter))
	case c.NotAfter.After(want.Add(slack)):
		return fmt.Sprintf("it ends at %s, later than asked (%s, give or take %s)", end(c.NotAfter), end(want), slack)
	case c.NotAfter.Before(want.Add(-slack)):
		return fmt.Sprintf("it ends at %s, sooner than asked (%s, give or take %s)", end(c.NotAfter), end(want), slack)
	case now.Before(c.NotBefore):
		return fmt.Sprintf("it is not valid before %s: is the upstream's clock ahead?", end(c.NotBefore))
	}
	for _, x := range chain {
		if x.NotAfter.Before(c.NotAfter) {
			return fmt.Sprintf("%q of its chain ends at %s, before it", x.Subject, end(x.NotAfter))
		}
	}
	return ""
}

// chainRule is why c does not chain to root through chain at now so that
// its leaves verify, or "".
func chainRule(c *x509.Certificate, chain []*x509.Certificate, root *x509.Certificate, now time.Time) string {
	paths, err := c.Verify(x509.VerifyOptions{
		Roots:         certs.Pool(root),
		Intermediates: certs.Pool(chain...),
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	if err != nil {
		return fmt.Sprintf("it does not chain to root %q: %v", root.Subject, err)
	}
	for _, p := range paths {
		if err = certs.CanIssueLeaves(p); err == nil {
			return ""
		}
	}
	return fmt.Sprintf("its leaves would break a path length constraint above it: %v", err)
}
