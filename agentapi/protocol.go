// Package agentapi is the natgw agent's API, the wire format between the controller and a gateway's
// `natgw serve` agent: one JSON object per line in each direction over the
// agent's stdin/stdout (a pod-exec session or a local pipe). Every request
// carries an id that its response repeats; the agent answers requests in the
// order it reads them, one kernel transaction per request.
package agentapi

import (
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/gwqos"
)

// Ops a Request may carry.
const (
	OpApply  = "apply"  // Objects: add or update, one transaction
	OpDelete = "delete" // UIDs: delete by UID, one transaction
	OpList   = "list"   // Fresh: re-read the kernel first
	OpSync   = "sync"   // Objects: the whole desired set, one transaction
	OpInfo   = "info"   // version, data plane, boot id, counts
	// OpGatewayQoS: QoS, the gateway's whole gateway-wide QoS (package
	// nat/gwqos; a rule without interface is on the agent's external
	// interface), replacing what it held, one transaction; none removes it.
	OpGatewayQoS = "gwqos"
)

// MaxLineBytes bounds one request line; longer lines get an error response.
// 64 MiB holds a sync of well over 100,000 objects.
const MaxLineBytes = 64 << 20

// Request is one line from the controller to the agent.
type Request struct {
	ID      uint64       `json:"id"`
	Op      string       `json:"op"`
	Objects []nat.Object `json:"objects,omitempty"`
	UIDs    []string     `json:"uids,omitempty"`
	// Fresh asks list to re-read the kernel instead of the agent's index
	// (drift detection).
	Fresh bool `json:"fresh,omitempty"`
	// QoS is the gateway-wide QoS of a gwqos request.
	QoS []gwqos.Rule `json:"qos,omitempty"`
}

// Error codes of a failed Response.
const (
	CodeBadRequest   = "BadRequest"   // the line is not a valid request
	CodeInvalid      = "Invalid"      // an object failed validation (nat.ErrInvalid)
	CodeConflict     = "Conflict"     // an object conflicts with another (nat.ErrConflict)
	CodeUnknownState = "UnknownState" // the kernel may or may not hold the change (nat.ErrUnknownState)
	CodeInternal     = "Internal"     // anything else; nothing was changed
)

// Error describes why a request failed. Field and Value name the offending
// field and value when the failure is about one.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	UID     string `json:"uid,omitempty"`
	Field   string `json:"field,omitempty"`
	Value   string `json:"value,omitempty"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Response is one line from the agent to the controller.
type Response struct {
	ID      uint64       `json:"id"`
	OK      bool         `json:"ok"`
	Error   *Error       `json:"error,omitempty"`
	Objects []nat.Object `json:"objects,omitempty"` // list
	Info    *Info        `json:"info,omitempty"`    // info
	// Changed says that a gwqos request wrote the kernel (it held
	// something else); false when it already held the rules.
	Changed bool `json:"changed,omitempty"`
}

// Info describes a running agent.
type Info struct {
	Version   string            `json:"version"`
	Dataplane nat.DataplaneName `json:"dataplane"`
	// BootID changes whenever the agent's kernel state may have been lost
	// (a new agent on an empty table, a table recreated); the controller
	// answers a new BootID with a full sync.
	BootID string           `json:"bootID"`
	Counts map[nat.Kind]int `json:"counts"`
}

// RulesSyncedFile is where the agent of a two-replica gateway's pod (`natgw
// serve --rules-only --synced-file`) leaves its mark after each successful
// sync, and where the pod's `natgw ha` container looks for it
// (--rules-synced-file) before its replica may lead: a directory both
// containers mount (an emptyDir, gone with the pod), so a replica in a new
// pod waits for the controller's first sync. The controller's exec
// transport and its provisioned pod template both use this path.
const RulesSyncedFile = "/run/natgw/rules-synced"
