package vaultauth

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/hashicorp/vault/api"
	"github.com/hashicorp/vault/api/auth/approle"
	"github.com/hashicorp/vault/api/auth/kubernetes"
)

// TokenFile logs in with a Vault token read from a file at every login, so
// that a token rotated on disk (by Vault Agent, say) is picked up.
type TokenFile struct {
	Path string
}

// Login implements api.AuthMethod: it looks the token up to learn its
// lifetime and whether it can be renewed.
func (t TokenFile) Login(ctx context.Context, c *api.Client) (*api.Secret, error) {
	raw, err := os.ReadFile(t.Path)
	if err != nil {
		return nil, fmt.Errorf("vault token file: %w", err)
	}
	token := strings.TrimSpace(string(raw))
	if token == "" {
		return nil, errors.New("vault token file is empty")
	}
	c.SetToken(token)
	s, err := c.Auth().Token().LookupSelfWithContext(ctx)
	if err != nil {
		return nil, err
	}
	// Shape the lookup like a login answer, so one renewal loop serves all
	// methods.
	ttl, _ := s.TokenTTL()
	renewable, _ := s.TokenIsRenewable()
	lease := int(ttl.Seconds())
	if lease == 0 && s.Data["expire_time"] != nil {
		// Less than a second left, which Vault rounds down to 0: not a
		// token that never expires (those have no expire_time).
		lease = 1
	}
	return &api.Secret{Auth: &api.SecretAuth{ClientToken: token, LeaseDuration: lease, Renewable: renewable}}, nil
}

// AppRole returns the AppRole login method with the secret id read from a
// file or an environment variable.
func AppRole(mount, roleID, secretIDFile, secretIDEnv string) (api.AuthMethod, error) {
	sid := &approle.SecretID{FromFile: secretIDFile, FromEnv: secretIDEnv}
	var opts []approle.LoginOption
	if mount != "" {
		opts = append(opts, approle.WithMountPath(mount))
	}
	return approle.NewAppRoleAuth(roleID, sid, opts...)
}

// Kubernetes returns the Kubernetes login method with the service-account
// token read from tokenPath (the projected token of meshca's own Pod) at
// every login, as TokenFile reads its token: the kubelet replaces that
// token well before it expires, and one read at start only would be
// refused at the first login after it expired. The file is read here too,
// so that a wrong path fails at start.
func Kubernetes(mount, role, tokenPath string) (api.AuthMethod, error) {
	k := kubernetesLogin{mount: mount, role: role, tokenPath: tokenPath}
	if _, err := k.method(); err != nil {
		return nil, err
	}
	return k, nil
}

// kubernetesLogin is Vault's Kubernetes login method, made afresh for
// each login from the token file as it is then.
type kubernetesLogin struct{ mount, role, tokenPath string }

func (k kubernetesLogin) method() (*kubernetes.KubernetesAuth, error) {
	opts := []kubernetes.LoginOption{kubernetes.WithServiceAccountTokenPath(k.tokenPath)}
	if k.mount != "" {
		opts = append(opts, kubernetes.WithMountPath(k.mount))
	}
	return kubernetes.NewKubernetesAuth(k.role, opts...)
}

// Login implements api.AuthMethod with the token the file holds now.
func (k kubernetesLogin) Login(ctx context.Context, c *api.Client) (*api.Secret, error) {
	m, err := k.method()
	if err != nil {
		return nil, err
	}
	return m.Login(ctx, c)
}
