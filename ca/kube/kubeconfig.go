package kube

import (
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// KubeconfigAllowFlag names the serve flag that lets kubeconfigs from
// remote-cluster Secrets use the features below; errors point to it.
const KubeconfigAllowFlag = "remote-secret-kubeconfig-allow"

// KubeconfigFeature is a kubeconfig field that makes a client run a
// command or read a file of the machine it runs on, believe any server,
// or talk to it in cleartext. Its value is the field's name in a
// kubeconfig (for http, the scheme of a cluster's server), and the flag
// value that allows it.
type KubeconfigFeature string

// Features refused in a kubeconfig from a Secret unless allowed.
const (
	KubeconfigExec                 KubeconfigFeature = "exec"                  // user.exec: runs a command
	KubeconfigAuthProvider         KubeconfigFeature = "auth-provider"         // user.auth-provider: plugins may run commands and read files
	KubeconfigTokenFile            KubeconfigFeature = "tokenFile"             // user.tokenFile: sends a local file as the bearer token
	KubeconfigClientCertificate    KubeconfigFeature = "client-certificate"    // user.client-certificate: reads a local file
	KubeconfigClientKey            KubeconfigFeature = "client-key"            // user.client-key: reads a local file
	KubeconfigCertificateAuthority KubeconfigFeature = "certificate-authority" // cluster.certificate-authority: reads a local file
	// cluster.insecure-skip-tls-verify: believes whoever answers at the
	// server's address, and that cluster's TokenReviews decide which
	// identities of the trust domain meshca issues.
	KubeconfigInsecureSkipTLSVerify KubeconfigFeature = "insecure-skip-tls-verify"
	// cluster.server http://...: no TLS at all. Every workload token meshca
	// sends for review, and its own credential, cross the network in
	// cleartext, and whoever answers decides the review.
	KubeconfigHTTP KubeconfigFeature = "http"
)

// KubeconfigFeatures lists every feature, as the flag's help shows them.
var KubeconfigFeatures = []KubeconfigFeature{
	KubeconfigExec, KubeconfigAuthProvider, KubeconfigTokenFile,
	KubeconfigClientCertificate, KubeconfigClientKey, KubeconfigCertificateAuthority, KubeconfigInsecureSkipTLSVerify,
	KubeconfigHTTP,
}

// Reason is the feature's metric label.
func (f KubeconfigFeature) Reason() string {
	switch f {
	case KubeconfigTokenFile:
		return "token_file"
	default:
		return strings.ReplaceAll(string(f), "-", "_")
	}
}

// KubeconfigAllow is the set of features a kubeconfig from a Secret may
// use. The zero value allows none.
type KubeconfigAllow map[KubeconfigFeature]bool

// ParseKubeconfigAllow reads the flag's values.
func ParseKubeconfigAllow(values []string) (KubeconfigAllow, error) {
	allow := KubeconfigAllow{}
	for _, v := range values {
		f := KubeconfigFeature(strings.TrimSpace(v))
		if !slices.Contains(KubeconfigFeatures, f) {
			return nil, fmt.Errorf("kube: unknown kubeconfig feature %q, want some of %v", v, KubeconfigFeatures)
		}
		allow[f] = true
	}
	return allow, nil
}

// KubeconfigError says why a kubeconfig from a Secret was refused. It
// names fields, never their values.
type KubeconfigError struct {
	// Feature is the refused feature; "" when the kubeconfig is unusable.
	Feature KubeconfigFeature
	// Entry is where it was found, e.g. `user "admin"`.
	Entry string
	// Detail says why an unusable kubeconfig is refused.
	Detail string
}

func (e *KubeconfigError) Error() string {
	if e.Feature == "" {
		return "kube: kubeconfig: " + e.Detail
	}
	uses := string(e.Feature)
	if e.Feature == KubeconfigHTTP {
		uses = "an http:// server (no TLS: tokens would cross the network in cleartext)"
	}
	return fmt.Sprintf("kube: kubeconfig: %s uses %s, refused unless --%s includes %s",
		e.Entry, uses, KubeconfigAllowFlag, e.Feature)
}

// Reason is the refusal's metric label.
func (e *KubeconfigError) Reason() string {
	if e.Feature == "" {
		return reasonInvalidKubeconfig
	}
	return e.Feature.Reason()
}

// SanitizeKubeconfig reads a kubeconfig that came from a Secret, which
// whoever may write Secrets in the watched namespace controls, and
// returns its client configuration. Every user and cluster in the file is
// judged, used by the current context or not: one using a feature that
// allow does not name is refused with a *KubeconfigError. Fields this
// function does not know (extensions, preferences, fields added to
// client-go later) are dropped before the configuration is built.
func SanitizeKubeconfig(raw []byte, allow KubeconfigAllow) (*rest.Config, error) {
	in, err := clientcmd.Load(raw)
	if err != nil {
		// The parser's message may quote the file, which holds credentials.
		return nil, &KubeconfigError{Detail: "does not parse as a kubeconfig"}
	}
	out := clientcmdapi.NewConfig()
	out.CurrentContext = in.CurrentContext
	for _, name := range kubeconfigNames(in.Clusters) {
		c := in.Clusters[name]
		if c.CertificateAuthority != "" && !allow[KubeconfigCertificateAuthority] {
			return nil, &KubeconfigError{Feature: KubeconfigCertificateAuthority, Entry: fmt.Sprintf("cluster %q", name)}
		}
		if c.InsecureSkipTLSVerify && !allow[KubeconfigInsecureSkipTLSVerify] {
			return nil, &KubeconfigError{Feature: KubeconfigInsecureSkipTLSVerify, Entry: fmt.Sprintf("cluster %q", name)}
		}
		if f, detail := serverProblem(c.Server); f != "" && !allow[f] {
			return nil, &KubeconfigError{Feature: f, Entry: fmt.Sprintf("cluster %q", name)}
		} else if detail != "" {
			return nil, &KubeconfigError{Detail: fmt.Sprintf("cluster %q: %s", name, detail)}
		}
		if detail := proxyURLProblem(c.ProxyURL); detail != "" {
			return nil, &KubeconfigError{Detail: fmt.Sprintf("cluster %q: %s", name, detail)}
		}
		out.Clusters[name] = &clientcmdapi.Cluster{
			Server:                   c.Server,
			TLSServerName:            c.TLSServerName,
			InsecureSkipTLSVerify:    c.InsecureSkipTLSVerify,
			CertificateAuthority:     c.CertificateAuthority,
			CertificateAuthorityData: c.CertificateAuthorityData,
			ProxyURL:                 c.ProxyURL,
			DisableCompression:       c.DisableCompression,
		}
	}
	for _, name := range kubeconfigNames(in.AuthInfos) {
		a := in.AuthInfos[name]
		if f, ok := refusedFeature(a, allow); ok {
			return nil, &KubeconfigError{Feature: f, Entry: fmt.Sprintf("user %q", name)}
		}
		out.AuthInfos[name] = &clientcmdapi.AuthInfo{
			ClientCertificate:     a.ClientCertificate,
			ClientCertificateData: a.ClientCertificateData,
			ClientKey:             a.ClientKey,
			ClientKeyData:         a.ClientKeyData,
			Token:                 a.Token,
			TokenFile:             a.TokenFile,
			Impersonate:           a.Impersonate,
			ImpersonateUID:        a.ImpersonateUID,
			ImpersonateGroups:     a.ImpersonateGroups,
			ImpersonateUserExtra:  a.ImpersonateUserExtra,
			Username:              a.Username,
			Password:              a.Password,
			AuthProvider:          a.AuthProvider,
			Exec:                  a.Exec,
		}
	}
	for name, c := range in.Contexts {
		out.Contexts[name] = &clientcmdapi.Context{Cluster: c.Cluster, AuthInfo: c.AuthInfo, Namespace: c.Namespace}
	}
	rc, err := clientcmd.NewDefaultClientConfig(*out, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, &KubeconfigError{Detail: "unusable: " + err.Error()}
	}
	if f, ok := restConfigFeature(rc, allow); ok {
		// Unreachable while the checks above match client-go.
		return nil, &KubeconfigError{Feature: f, Entry: "the client configuration"}
	}
	return rc, nil
}

// serverProblem judges a cluster's server: an https URL is fine; an http
// one uses KubeconfigHTTP; anything else, which client-go would reach
// over http or https depending on other fields, is refused with a
// detail. An empty server is left to client-go, which refuses it when
// the cluster is used. Neither answer quotes the URL, which may hold a
// password.
func serverProblem(raw string) (KubeconfigFeature, string) {
	if raw == "" {
		return "", ""
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil || u.Host == "" || u.Scheme != "http" && u.Scheme != "https":
		return "", "server must be an https:// URL"
	case u.Scheme == "http":
		return KubeconfigHTTP, ""
	}
	return "", ""
}

// proxyURLProblem says why client-go would refuse a cluster's proxy-url,
// or "". client-go's own message quotes the URL, which may hold a
// password: this one names neither the URL nor any part of it.
func proxyURLProblem(raw string) string {
	if raw == "" {
		return ""
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return "proxy-url does not parse"
	case u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "socks5":
		return "proxy-url must be an http, https or socks5 URL"
	}
	return ""
}

// refusedFeature returns the first feature a uses that allow does not
// name.
func refusedFeature(a *clientcmdapi.AuthInfo, allow KubeconfigAllow) (KubeconfigFeature, bool) {
	uses := map[KubeconfigFeature]bool{
		KubeconfigExec:              a.Exec != nil,
		KubeconfigAuthProvider:      a.AuthProvider != nil,
		KubeconfigTokenFile:         a.TokenFile != "",
		KubeconfigClientCertificate: a.ClientCertificate != "",
		KubeconfigClientKey:         a.ClientKey != "",
	}
	for _, f := range KubeconfigFeatures {
		if uses[f] && !allow[f] {
			return f, true
		}
	}
	return "", false
}

// restConfigFeature checks the built configuration again, so that a
// change in how client-go maps a kubeconfig cannot let a feature through.
func restConfigFeature(rc *rest.Config, allow KubeconfigAllow) (KubeconfigFeature, bool) {
	uses := map[KubeconfigFeature]bool{
		KubeconfigExec:                  rc.ExecProvider != nil,
		KubeconfigAuthProvider:          rc.AuthProvider != nil,
		KubeconfigTokenFile:             rc.BearerTokenFile != "",
		KubeconfigClientCertificate:     rc.CertFile != "",
		KubeconfigClientKey:             rc.KeyFile != "",
		KubeconfigCertificateAuthority:  rc.CAFile != "",
		KubeconfigInsecureSkipTLSVerify: rc.Insecure,
		KubeconfigHTTP:                  !rest.IsConfigTransportTLS(*rc),
	}
	for _, f := range KubeconfigFeatures {
		if uses[f] && !allow[f] {
			return f, true
		}
	}
	return "", false
}

func kubeconfigNames[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
