package serve

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/kube"
	"github.com/meshca/meshca/ca/trust/bundleendpoint"
	"k8s.io/client-go/rest"
)

// OwnAccount is the service account whose credentials cfg carries, read
// from the claims of its bearer token: in a Pod, the token Kubernetes
// mounts for the Pod's service account (the in-cluster configuration);
// out of cluster, a kubeconfig's token or tokenFile. ok is false for
// credentials of no service account: a client certificate, an exec
// plugin, a token that is no service account's JWT. The token is not
// verified: it is meshca's own credential, and is used here only to name
// the account, never to grant anything.
func OwnAccount(cfg *rest.Config) (ns, sa string, ok bool, err error) {
	token := cfg.BearerToken
	if token == "" && cfg.BearerTokenFile != "" {
		raw, err := os.ReadFile(cfg.BearerTokenFile)
		if err != nil {
			return "", "", false, fmt.Errorf("meshca's own service account: %w", err)
		}
		token = strings.TrimSpace(string(raw))
	}
	if token == "" {
		return "", "", false, nil
	}
	c, err := kube.ReadClaims(token)
	if err != nil || c.Namespace == "" || c.ServiceAccount == "" {
		return "", "", false, nil
	}
	return c.Namespace, c.ServiceAccount, true, nil
}

// denyOwnAccount is deny with meshca's own account (OwnAccount), the one whose
// credentials cfg carries, denied to node proxies: a node proxy could
// otherwise be issued the identity of the CA itself wherever one of its
// Pods runs on the proxy's node. Without such an account (out of cluster,
// as a user) deny is returned as it is.
func denyOwnAccount(deny *ca.DenyList, cfg *rest.Config, log *slog.Logger) (*ca.DenyList, error) {
	ns, sa, ok, err := OwnAccount(cfg)
	if err != nil || !ok {
		return deny, err
	}
	if deny, err = deny.WithOwn(ns, sa); err != nil {
		return nil, err
	}
	log.Info("node proxies may not request meshca's own identity", "account", ns+"/"+sa)
	return deny, nil
}

// denyEndpointID is deny with the account of the bundle endpoint's SPIFFE
// ID denied to node proxies, when the endpoint presents an X509-SVID of
// meshca's CA (https_spiffe) for a workload identity
// (/ns/<namespace>/sa/<account>): a node proxy issued that identity could
// serve a federated control plane a bundle of its own.
func denyEndpointID(deny *ca.DenyList, plan *bundlePlan) (*ca.DenyList, error) {
	if plan == nil || plan.profile != bundleendpoint.ProfileSPIFFE {
		return deny, nil
	}
	parts := strings.Split(plan.c.ID.Path(), "/")
	if len(parts) != 5 || parts[1] != "ns" || parts[3] != "sa" {
		return deny, nil
	}
	out, err := deny.WithOwn(parts[2], parts[4])
	if err != nil {
		return nil, &FieldError{Field: "bundle-endpoint-spiffe-id", Err: err}
	}
	return out, nil
}
