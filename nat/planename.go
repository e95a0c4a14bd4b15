package nat

import (
	"fmt"
	"strings"
)

// DataplaneName names one of natgw's data planes: what Dataplane.Name
// returns and what every place that chooses one takes (`natgw --dataplane`
// and $NATGW_DATAPLANE, natgw-controller's --dataplane, the gateway config's
// `dataplane:`, the VpcNatGateway annotation natgw.kubeovn.io/dataplane, the
// agent's hello). Its text (flags, JSON, annotations, metric labels) is the
// plain name. The backends live in nat/nftables and nat/iptables;
// nat/planes opens them by these names.
type DataplaneName string

// The data planes. These consts are the one place the names are spelled.
const (
	DataplaneNftables DataplaneName = "nftables"
	DataplaneIptables DataplaneName = "iptables"
)

// DataplaneNames lists the data planes, the default (nftables) first.
var DataplaneNames = []DataplaneName{DataplaneNftables, DataplaneIptables}

// String returns the name as written in flags, JSON and labels.
func (n DataplaneName) String() string { return string(n) }

// Valid returns nil when n is one of DataplaneNames, else an error naming
// the value and the names natgw knows (callers wrap it with where n came
// from; ParseDataplaneName does).
func (n DataplaneName) Valid() error {
	for _, k := range DataplaneNames {
		if n == k {
			return nil
		}
	}
	want := make([]string, len(DataplaneNames))
	for i, k := range DataplaneNames {
		want[i] = string(k)
	}
	return fmt.Errorf("unknown data plane %q (want %s)", string(n), strings.Join(want, " or "))
}

// ParseDataplaneName returns value as a DataplaneName, or an error naming
// field (a flag, a config field, an annotation: where the value came from)
// and the value. It is the one check of a data plane name.
func ParseDataplaneName(field, value string) (DataplaneName, error) {
	n := DataplaneName(value)
	if err := n.Valid(); err != nil {
		return "", fmt.Errorf("%s: %w", field, err)
	}
	return n, nil
}

// Set implements flag.Value: a flag of this type accepts only the names in
// DataplaneNames (the flag package names the flag in its error).
func (n *DataplaneName) Set(value string) error {
	v := DataplaneName(value)
	if err := v.Valid(); err != nil {
		return err
	}
	*n = v
	return nil
}
