package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/meshca/meshca/ca/istiodcert"
	"github.com/meshca/meshca/ca/serve"
)

// istiodFlags are the flags of istiod's serving certificate.
type istiodFlags struct {
	secret     string
	names      []string
	revision   string
	ttl        time.Duration
	deployment string
}

func (f *istiodFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&f.secret, "istiod-cert-secret", "", "keep istiod's serving certificate in this Secret, namespace/name (istiod-tls in istiod's namespace: tls.crt, tls.key, ca.crt), "+
		"issued by the signer and rewritten through every root rotation step; one replica writes, elected on the Lease "+serve.IstiodCertLease+" in --trust-lease-namespace; "+
		"only a Secret it creates, one annotated "+istiodcert.AnnotationOwner+"=<lease namespace>/"+serve.IstiodCertLease+", or one an operator annotated "+istiodcert.AnnotationAdopt+"=true; "+
		"never --state-secret, cacerts or istio-ca-secret; empty: off")
	fl.StringSliceVar(&f.names, "istiod-cert-dns-names", nil, "DNS names of istiod's certificate; empty: istiod.<namespace>.svc, and istiod-<revision>.<namespace>.svc with --istiod-revision")
	fl.StringVar(&f.revision, "istiod-revision", "", "istiod's revision (its chart's revision value), whose Service name joins the default DNS names")
	fl.StringVar(&f.deployment, "istiod-deployment", "", "istiod's Deployment, in --istiod-cert-secret's namespace, restarted (as kubectl rollout restart) when the roots grow: "+
		"istiod reads the roots it verifies proxies' client certificates with only when it starts, and the guards of activate wait for the restart; empty: restart istiod yourself after prepare")
	fl.DurationVar(&f.ttl, "istiod-cert-ttl", istiodcert.DefaultTTL, "lifetime of istiod's certificate; it is renewed at two thirds of it")
}

// config checks the flags, without I/O; maxTTL is --max-ttl, stateSecret
// --state-secret.
func (f *istiodFlags) config(maxTTL time.Duration, stateSecret string) (serve.IstiodCert, error) {
	c := serve.IstiodCert{Secret: f.secret, TTL: f.ttl, Deployment: f.deployment}
	if f.secret == "" {
		if len(f.names) > 0 || f.revision != "" || f.deployment != "" {
			return c, errors.New("--istiod-cert-dns-names, --istiod-revision and --istiod-deployment need --istiod-cert-secret")
		}
		return c, nil
	}
	ns, name, ok := strings.Cut(f.secret, "/")
	switch {
	case !ok || ns == "" || name == "" || strings.Contains(name, "/"):
		return c, fmt.Errorf("--istiod-cert-secret %q: want namespace/name", f.secret)
	case f.ttl <= 0 || f.ttl > maxTTL:
		return c, fmt.Errorf("--istiod-cert-ttl %v must be positive and at most --max-ttl %v", f.ttl, maxTTL)
	case f.revision != "" && len(f.names) > 0:
		return c, errors.New("give --istiod-cert-dns-names or --istiod-revision, not both: the names are then yours to list")
	}
	if err := istiodcert.CheckSecretName(f.secret, stateSecret); err != nil {
		return c, fmt.Errorf("--istiod-cert-secret %w", err)
	}
	c.DNSNames = f.names
	if len(c.DNSNames) == 0 {
		c.DNSNames = []string{"istiod." + ns + ".svc"}
		if f.revision != "" && f.revision != "default" {
			c.DNSNames = append(c.DNSNames, "istiod-"+f.revision+"."+ns+".svc")
		}
	}
	if errs := validation.IsDNS1123Subdomain(f.deployment); f.deployment != "" && len(errs) > 0 {
		return c, fmt.Errorf("--istiod-deployment %q: %s", f.deployment, strings.Join(errs, "; "))
	}
	for _, n := range c.DNSNames {
		if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
			return c, fmt.Errorf("--istiod-cert-dns-names: %q is not a DNS name: %s", n, strings.Join(errs, "; "))
		}
	}
	return c, nil
}
