package ha

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Heartbeat wire format: one UDP datagram of msgSize bytes, sent by each
// replica to the other every Config.Interval over the internal network:
//
//	0..3  magic "NGHA"
//	4     version (1)
//	5     role (RoleStandby 1, RoleActive 2)
//	6     flags (flagHealthy: both interfaces up; flagSynced: its
//	      conntrack copy is complete, or it holds the live table:
//	      Replica.synced)
//	7     zero
//	8..15 sequence number, big endian
const (
	msgSize     = 16
	msgVersion  = 1
	flagHealthy = 1 << 0
	flagSynced  = 1 << 1
)

var magic = [4]byte{'N', 'G', 'H', 'A'}

// beat is one heartbeat.
type beat struct {
	Role    Role
	Healthy bool
	Synced  bool
	Seq     uint64
}

func (b beat) marshal() []byte {
	out := make([]byte, msgSize)
	copy(out, magic[:])
	out[4] = msgVersion
	out[5] = byte(b.Role)
	if b.Healthy {
		out[6] |= flagHealthy
	}
	if b.Synced {
		out[6] |= flagSynced
	}
	binary.BigEndian.PutUint64(out[8:], b.Seq)
	return out
}

var errNotBeat = errors.New("ha: not a heartbeat")

func parseBeat(p []byte) (beat, error) {
	if len(p) != msgSize || [4]byte(p[:4]) != magic {
		return beat{}, errNotBeat
	}
	if p[4] != msgVersion {
		return beat{}, fmt.Errorf("ha: heartbeat version %d, want %d", p[4], msgVersion)
	}
	r := Role(p[5])
	if r != RoleStandby && r != RoleActive {
		return beat{}, fmt.Errorf("ha: heartbeat role %d, want 1 or 2", p[5])
	}
	return beat{Role: r, Healthy: p[6]&flagHealthy != 0, Synced: p[6]&flagSynced != 0, Seq: binary.BigEndian.Uint64(p[8:])}, nil
}
