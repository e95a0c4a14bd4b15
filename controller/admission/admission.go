package admission

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/nat"
)

// Path is the webhook's URL path (controller/config/webhook).
const Path = "/validate-kubeovn-io-v1-nat"

// lookupTimeout bounds the reads of one review; the API server's own
// timeout (timeoutSeconds: 10) is longer.
const lookupTimeout = 5 * time.Second

// Validator answers the API server's admission reviews of the five NAT
// kinds.
type Validator struct {
	// Reader reads NAT objects and QoSPolicies: the manager's cache, with
	// the indexes of reconciler.RegisterIndexes.
	Reader client.Reader
	// KubeOVN: Kube-OVN's Subnets and Vpcs are the gateways' networks
	// (--network-source=kube-ovn): a gateway's VPC, subnet and lanIp, and
	// an EIP's external subnet and address are checked against them.
	KubeOVN bool

	decoder admission.Decoder
}

// New returns a Validator decoding with scheme (which must hold natgw's
// kubeovn.io/v1 types).
func New(r client.Reader, scheme *runtime.Scheme, kubeOVN bool) *Validator {
	return &Validator{Reader: r, KubeOVN: kubeOVN, decoder: admission.NewDecoder(scheme)}
}

// Register serves the Validator on srv at Path.
func (v *Validator) Register(srv webhook.Server) {
	srv.Register(Path, &webhook.Admission{Handler: v})
}

// newObject returns an empty object of a reviewed kind.
func newObject(kind string) (client.Object, error) {
	switch kind {
	case "VpcNatGateway":
		return &v1.VpcNatGateway{}, nil
	case "IptablesEIP":
		return &v1.IptablesEIP{}, nil
	case "IptablesFIPRule":
		return &v1.IptablesFIPRule{}, nil
	case "IptablesDnatRule":
		return &v1.IptablesDnatRule{}, nil
	case "IptablesSnatRule":
		return &v1.IptablesSnatRule{}, nil
	}
	return nil, fmt.Errorf("kind %q is not one of natgw's NAT kinds", kind)
}

// decode returns the review's object and old object (nil when absent).
func (v *Validator) decode(req admission.Request) (obj, old client.Object, err error) {
	decode := func(raw runtime.RawExtension) (client.Object, error) {
		if len(raw.Raw) == 0 {
			return nil, nil
		}
		o, err := newObject(req.Kind.Kind)
		if err != nil {
			return nil, err
		}
		if err := v.decoder.DecodeRaw(raw, o); err != nil {
			return nil, fmt.Errorf("decode %s %s: %w", req.Kind.Kind, req.Name, err)
		}
		return o, nil
	}
	if obj, err = decode(req.Object); err != nil {
		return nil, nil, err
	}
	if old, err = decode(req.OldObject); err != nil {
		return nil, nil, err
	}
	return obj, old, nil
}

// Handle reviews one request.
func (v *Validator) Handle(ctx context.Context, req admission.Request) admission.Response {
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	obj, old, err := v.decode(req)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	var errs field.ErrorList
	switch req.Operation {
	case admissionv1.Delete:
		if old == nil {
			return admission.Allowed("")
		}
		users, err := v.users(ctx, old)
		if err != nil {
			return admission.Errored(http.StatusInternalServerError, err)
		}
		if users != "" {
			return admission.Denied(fmt.Sprintf("%s %q is still used by %s: delete those first", req.Kind.Kind, old.GetName(), users))
		}
		return admission.Allowed("")
	case admissionv1.Create:
		errs, err = v.checkSpec(ctx, obj)
	case admissionv1.Update:
		errs = immutable(old, obj)
		if len(errs) == 0 && specChanged(old, obj) {
			errs, err = v.checkSpec(ctx, obj)
		}
	default:
		return admission.Allowed("")
	}
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if len(errs) > 0 {
		st := apierrors.NewInvalid(schema.GroupKind{Group: req.Kind.Group, Kind: req.Kind.Kind}, req.Name, errs).ErrStatus
		return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &st}}
	}
	return admission.Allowed("")
}

// checkSpec runs the checks of a created or changed object. A lookup that
// fails (other than not found) is err: the review fails, nothing is judged.
func (v *Validator) checkSpec(ctx context.Context, obj client.Object) (field.ErrorList, error) {
	switch o := obj.(type) {
	case *v1.VpcNatGateway:
		return v.gateway(ctx, o)
	case *v1.IptablesEIP:
		return v.eip(ctx, o)
	default:
		return v.rule(ctx, obj)
	}
}

// fieldError turns the reconcile's *nat.FieldError into a field.Error;
// another error is returned as it is.
func fieldError(err error) (*field.Error, error) {
	var fe *nat.FieldError
	if errors.As(err, &fe) {
		return &field.Error{Type: field.ErrorTypeInvalid, Field: fe.Field, BadValue: fe.Value, Detail: fe.Reason}, nil
	}
	return nil, err
}
