package csr

import (
	"crypto/x509"
	"encoding/asn1"
	"errors"
)

// CheckStub checks the stub request of a PodCertificateRequest
// (spec.stubPKCS10Request), which only lends the Pod's key: the kubelet
// makes it from an empty template, with no subject, attributes or
// extensions. A stub asking for anything else was not made by a kubelet
// as Kubernetes 1.37 makes them; it is refused, so that nothing in it
// reaches a backend that reads the request (cfssl, Vault, a k8scsr
// signer), and the refusal says what it asked for. The signature is
// checked by Parse.
func CheckStub(req *x509.CertificateRequest) error {
	const why = "a kubelet's stub carries the Pod's key alone, and meshca issues the SPIFFE ID of the Pod's service account only"
	attrs, err := rawAttributes(req.RawTBSCertificateRequest)
	switch {
	case err != nil:
		return &Error{Reason: ReasonMalformed, Detail: "cannot read its attributes", Err: err}
	case len(req.Subject.Names) != 0:
		return errorf(ReasonExtraName, "it has a subject (%s): %s", req.Subject, why)
	case len(req.Extensions) != 0:
		id := req.Extensions[0].Id
		if id.Equal(oidSAN) {
			return errorf(ReasonExtension, "it asks for extension %s (subjectAltName): %s", id, why)
		}
		return errorf(ReasonExtension, "it asks for extension %s: %s", id, why)
	case len(attrs) != 0:
		return errorf(ReasonExtension, "it has attribute %s: %s", attrs[0], why)
	}
	return nil
}

// rawAttributes are the types of the attributes in a request's
// certificationRequestInfo, read from its DER: crypto/x509 leaves out of
// CertificateRequest.Attributes any attribute whose values are not lists
// of type and value (a challengePassword is a string).
func rawAttributes(tbs []byte) ([]asn1.ObjectIdentifier, error) {
	var info struct {
		Version    int
		Subject    asn1.RawValue
		PublicKey  asn1.RawValue
		Attributes []asn1.RawValue `asn1:"tag:0"`
	}
	if rest, err := asn1.Unmarshal(tbs, &info); err != nil {
		return nil, err
	} else if len(rest) != 0 {
		return nil, errors.New("trailing data after certificationRequestInfo")
	}
	out := make([]asn1.ObjectIdentifier, 0, len(info.Attributes))
	for _, a := range info.Attributes {
		var attr struct {
			Type   asn1.ObjectIdentifier
			Values asn1.RawValue `asn1:"set"`
		}
		if _, err := asn1.Unmarshal(a.FullBytes, &attr); err != nil {
			return nil, err
		}
		out = append(out, attr.Type)
	}
	return out, nil
}
