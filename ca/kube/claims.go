package kube

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Claims are the claims of a service-account token that meshca reads.
type Claims struct {
	// Exp is the token's expiry; zero when absent.
	Exp time.Time
	// Namespace and ServiceAccount are the kubernetes.io claims.
	Namespace, ServiceAccount string
	// PodName and PodUID are the kubernetes.io pod claim of a token
	// bound to a Pod; empty otherwise.
	PodName, PodUID string
	// Audiences is the aud claim, a string or a list of them; nil when
	// absent or of another shape.
	Audiences []string
}

// ReadClaims decodes the payload of a JWT WITHOUT verifying it: use it
// only on a token the apiserver has just accepted, or to describe a token
// that the CA will verify.
func ReadClaims(token string) (*Claims, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return nil, errors.New("kube: not a JWT")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return nil, fmt.Errorf("kube: JWT payload: %w", err)
	}
	var raw struct {
		Exp int64           `json:"exp"`
		Aud json.RawMessage `json:"aud"`
		K8s struct {
			Namespace      string `json:"namespace"`
			ServiceAccount struct {
				Name string `json:"name"`
			} `json:"serviceaccount"`
			Pod struct {
				Name string `json:"name"`
				UID  string `json:"uid"`
			} `json:"pod"`
		} `json:"kubernetes.io"`
	}
	if err := json.Unmarshal(payload, &raw); err != nil {
		return nil, fmt.Errorf("kube: JWT claims: %w", err)
	}
	c := &Claims{Namespace: raw.K8s.Namespace, ServiceAccount: raw.K8s.ServiceAccount.Name,
		PodName: raw.K8s.Pod.Name, PodUID: raw.K8s.Pod.UID, Audiences: audiences(raw.Aud)}
	if raw.Exp > 0 {
		c.Exp = time.Unix(raw.Exp, 0)
	}
	return c, nil
}

// audiences reads an aud claim: one string or a list of them (RFC 7519,
// section 4.1.3); nil for anything else.
func audiences(raw json.RawMessage) []string {
	var one string
	if json.Unmarshal(raw, &one) == nil && one != "" {
		return []string{one}
	}
	var list []string
	if json.Unmarshal(raw, &list) == nil {
		return list
	}
	return nil
}

// tokenExpiry is the exp claim of a token the apiserver has just
// accepted; zero when absent or unreadable.
func tokenExpiry(token string) time.Time {
	c, err := ReadClaims(token)
	if err != nil {
		return time.Time{}
	}
	return c.Exp
}
