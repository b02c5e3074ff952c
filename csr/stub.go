package csr

import (
	"crypto/x509"
	"encoding/asn1"
)

// CheckStub checks the stub request of a PodCertificateRequest
// (spec.stubPKCS10Request), which only lends the Pod's key: the kubelet
// makes it from an empty template, with no subject, attributes or
// extensions. A stub asking for anything else was not made by a kubelet
// as Kubernetes 1.37 makes them; it is refused, so that no name in it
// reaches a backend that reads the request (cfssl, Vault), and the
// refusal says what it asked for. The signature is checked by Parse.
func CheckStub(req *x509.CertificateRequest) error {
	const why = "a kubelet's stub carries the Pod's key alone, and meshca issues the SPIFFE ID of the Pod's service account only"
	switch {
	case len(req.Subject.Names) != 0:
		return errorf(ReasonExtraName, "it has a subject (%s): %s", req.Subject, why)
	case len(req.Extensions) != 0:
		id := req.Extensions[0].Id
		if id.Equal(oidSAN) {
			return errorf(ReasonExtension, "it asks for extension %s (subjectAltName): %s", id, why)
		}
		return errorf(ReasonExtension, "it asks for extension %s: %s", id, why)
	case len(stubAttributes(req)) != 0:
		return errorf(ReasonExtension, "it has attribute %s: %s", stubAttributes(req)[0], why)
	}
	return nil
}

// stubAttributes are the types of the request's attributes; crypto/x509
// keeps them in its deprecated Attributes field only.
func stubAttributes(req *x509.CertificateRequest) []asn1.ObjectIdentifier {
	var out []asn1.ObjectIdentifier
	//lint:ignore SA1019 the only place crypto/x509 keeps attributes other than extensions
	for _, a := range req.Attributes {
		out = append(out, a.Type)
	}
	return out
}
