package main

// The budgets, as data, taken from meshca's design notes: the package table
// (what each folder owns and must not do) and the size practice. Change the
// design first, then these.

// maxLines is the most lines a Go file not marked generated may have.
const maxLines = 500

// funcLimits are the most lines a function (or method) of a non-test file
// under each folder may have, its signature and closing brace counted: a
// command reads as flags, then a run of named steps.
var funcLimits = map[string]int{
	"cmd/": 60,
}

// allowedRequires are the direct requires the product go.mod may list,
// each with why: a well-kept library for its job, brought in on purpose.
// A new one comes in by a line here, in review.
var allowedRequires = map[string]string{
	"github.com/ThalesGroup/crypto11":                                   "the pkcs11 upstream: a root key in an HSM as a crypto.Signer, its sessions pooled (build tag pkcs11 only)",
	"github.com/cloudflare/cfssl":                                       "the cfssl backend, in process and remote",
	"github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus": "gRPC server metrics by method and code",
	"github.com/hashicorp/vault/api":                                    "the Vault PKI backend",
	"github.com/hashicorp/vault/api/auth/approle":                       "Vault's AppRole login",
	"github.com/hashicorp/vault/api/auth/kubernetes":                    "Vault's Kubernetes login",
	"github.com/miekg/pkcs11":                                           "PKCS#11 return codes and attributes, under crypto11 (build tag pkcs11 only)",
	"github.com/prometheus/client_golang":                               "metrics",
	"github.com/spf13/cobra":                                            "the CLI",
	"github.com/spf13/pflag":                                            "flags, as cobra and client-go use them",
	"github.com/spiffe/go-spiffe/v2":                                    "SPIFFE IDs and bundles",
	"golang.org/x/net":                                                  "HTTP/2 framing limits of the gRPC server",
	"golang.org/x/sync":                                                 "singleflight for shared lookups and reviews",
	"golang.org/x/time":                                                 "token-bucket rate limits",
	"google.golang.org/genproto/googleapis/rpc":                         "gRPC status details (retry hints)",
	"google.golang.org/grpc":                                            "the Istio CA API's transport",
	"google.golang.org/protobuf":                                        "the Istio CA API's messages",
	"k8s.io/api":                                                        "Kubernetes types",
	"k8s.io/apimachinery":                                               "Kubernetes machinery",
	"k8s.io/client-go":                                                  "the Kubernetes client, informers and leader election",
	"k8s.io/klog/v2":                                                    "routing client-go's logs into slog",
	"sigs.k8s.io/yaml":                                                  "the config file and -o yaml",
}

// buildTags are the builds whose files the layering and grpc/status
// rules read: the default one, and the HSM variant's files behind the
// build tag pkcs11 (make build-hsm).
var buildTags = []string{"", "pkcs11"}

// statusImport is the package that turns errors into gRPC status.
const statusImport = "google.golang.org/grpc/status"

// statusImporters are the packages whose non-test, non-generated code may
// import statusImport: ca maps errors to codes in one place (ca/errors.go),
// and ca/caclient reads the codes of the answers it gets. Other ca/ parts
// (ca/kube, ca/limit, ca/trust, ca/podcert) return errors and leave the
// mapping to ca: ca/limit's refusals are one type, limit.ExhaustedError.
var statusImporters = []string{"ca", "ca/caclient"}

// A layer is a set of packages of the product module and the layers their
// non-test code may import. Pkgs are paths relative to the module: "csr"
// names one package, "ca/..." names ca and everything under it. A package
// belongs to the layer of its most specific pattern (an exact path beats a
// "/..." pattern, a longer pattern beats a shorter one). A package that is
// in no layer, or imports one that is in no layer, is a violation: place it
// here. A part's Prometheus metrics live in its own <part>prom subpackage
// (keymgr/keymgrprom, vaultauth/vaultauthprom, ca/trust/trustprom,
// ca/leader/leaderprom), in the part's layer; ca/serve and cmd wire them.
type layer struct {
	Name string
	Pkgs []string
	May  []string // names of the layers this one may import
	Why  string
}

var layers = []layer{
	{
		Name: "proto", Pkgs: []string{"proto/..."},
		Why: "proto/ holds generated code and imports nothing of ours",
	},
	{
		Name: "internal", Pkgs: []string{"internal/..."}, May: []string{"internal"},
		Why: "internal/ helpers are the bottom layer",
	},
	{
		Name: "internal/testca", Pkgs: []string{"internal/testca"}, May: []string{"internal", "keymgr/certs", "keymgr"},
		Why: "the test CA builder makes keymgr material; it is the one internal package above keymgr",
	},
	{
		Name: "csr", Pkgs: []string{"csr/..."}, May: []string{"internal", "csr"},
		Why: "csr is the bottom of the domain and must not import signer, keymgr or ca",
	},
	{
		Name: "keymgr/certs", Pkgs: []string{"keymgr/certs"}, May: []string{"internal", "csr"},
		Why: "the certificate primitives (windows, serials, key types) are the bottom of the domain beside csr: every backend takes them without the CA lifecycle",
	},
	{
		Name: "upstream", Pkgs: []string{"keymgr/upstream/..."}, May: []string{"internal", "csr", "keymgr/certs", "upstream"},
		Why: "an upstream signs meshca's intermediate with a root key it keeps (keymgr/upstream and one package per upstream); it takes certificate primitives from keymgr/certs, never the CA state of keymgr, which renews through it",
	},
	{
		Name: "upstreamtest", Pkgs: []string{"keymgr/upstream/upstreamtest"}, May: []string{"internal", "internal/testca", "csr", "keymgr/certs", "upstream"},
		Why: "the upstreams' contract suite tests through the upstream interface, with test CAs of its own",
	},
	{
		Name: "keymgr", Pkgs: []string{"keymgr/..."}, May: []string{"internal", "csr", "keymgr/certs", "keymgr", "upstream"},
		Why: "keymgr owns key material and must not import signer, its backends, ca or cmd",
	},
	{
		Name: "vaultauth", Pkgs: []string{"vaultauth/..."}, May: []string{"internal", "vaultauth"},
		Why: "meshca's one login to Vault (session, renewal, re-login, failure kinds; vaultauthprom its gauges): the Vault signer and the Vault upstreams both log in through it, so it sits below signer and keymgr and imports neither",
	},
	{
		Name: "vault upstream", Pkgs: []string{"keymgr/upstream/vaultpki", "keymgr/upstream/vaulttransit"},
		May: []string{"internal", "csr", "keymgr/certs", "upstream", "vaultauth"},
		Why: "the Vault upstreams keep the root key in Vault (a PKI issuer, a Transit key); they are upstreams, and log in with vaultauth as the Vault signer does",
	},
	{
		Name: "signer", Pkgs: []string{"signer"}, May: []string{"internal", "csr"},
		Why: "the Signer interface rests on csr alone; backends import it, never the reverse, and it must not import ca",
	},
	{
		Name: "signer backend", Pkgs: []string{"signer/..."}, May: []string{"internal", "csr", "keymgr/certs", "signer", "vaultauth"},
		Why: "a backend implements signer; it takes certificate primitives from keymgr/certs, never the CA lifecycle of keymgr, and must not import another backend, ca or cmd",
	},
	{
		Name: "signer/local", Pkgs: []string{"signer/local"}, May: []string{"internal", "csr", "keymgr/certs", "keymgr", "signer"},
		Why: "the in-process backend signs with keymgr's authorities; it must not import another backend, ca or cmd",
	},
	{
		Name: "signertest", Pkgs: []string{"signer/signertest", "signer/k8scsr/k8scsrtest"},
		May: []string{"internal", "internal/testca", "csr", "keymgr/certs", "keymgr", "signer"},
		Why: "the contract suite and the backends' fakes test through signer and keymgr's authorities and must not import a backend",
	},
	{
		Name: "limits", Pkgs: []string{"ca/limit"}, May: []string{"internal"},
		Why: "ca/limit holds the budgets, slots and connection caps; it must not import ca, its parent, nor the parts it limits",
	},
	{
		Name: "leader", Pkgs: []string{"ca/leader/..."}, May: []string{"internal", "leader"},
		Why: "ca/leader runs work on one replica at a time (leaderprom its metric); the controllers import it, never the reverse",
	},
	{
		Name: "ca part", Pkgs: []string{"ca/..."},
		May: []string{"internal", "proto", "csr", "keymgr/certs", "keymgr", "signer", "limits", "leader", "ca part"},
		Why: "ca/<part> (kube, caclient, trust, podcert) is a part ca assembles; it must not import ca, its parent, or cmd",
	},
	{
		Name: "ca", Pkgs: []string{"ca"},
		May: []string{"internal", "proto", "csr", "keymgr/certs", "keymgr", "signer", "limits", "leader", "ca part"},
		Why: "ca is the server; it uses the domain packages and its own parts, and must not import a signer backend or cmd",
	},
	{
		Name: "assembly", Pkgs: []string{"ca/serve"},
		May: []string{"internal", "proto", "csr", "keymgr/certs", "keymgr", "upstream", "signer", "signer backend", "signer/local", "limits", "leader", "ca part", "ca"},
		Why: "ca/serve assembles meshca serve from every part; only cmd imports it",
	},
	{
		Name: "cmd", Pkgs: []string{"cmd/..."},
		May: []string{"internal", "proto", "csr", "keymgr/certs", "keymgr", "upstream", "vaultauth", "vault upstream", "signer", "signer backend", "signer/local", "limits", "leader", "ca part", "ca", "assembly"},
		Why: "cmd turns flags into configurations and wires the parts; nothing imports cmd",
	},
	{
		Name: "hack", Pkgs: []string{"hack/..."},
		Why: "hack/ tools stand alone",
	},
}

// testMayNotImport lists the layers that test code, too, must not import
// (a package's tests may import the package itself).
var testMayNotImport = []string{"cmd"}
