package nftables

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat/nftconn"
)

// The reads of natgw's table's structure at Load (which tables exist, the
// sets' types, the chains' hooks, the limit objects' names), dumped over
// natgw's own socket (nftconn.Socket.Dump) and decoded by the attribute
// walker every read uses (nftconn.Attrs): a few KB in four round trips,
// in the attributes Load checks and nothing else.

// kernelSet is what Load checks of a set of natgw's table (see
// setMismatch): its flags, key and data types (nft magic) and lengths.
type kernelSet struct {
	name              string
	isMap             bool
	keyType, keyLen   uint32
	dataType, dataLen uint32
}

// kernelChain is what Load checks of a chain of natgw's table (see
// sameHook): a base chain has a hook, a priority and a type.
type kernelChain struct {
	name    string
	base    bool   // it has a hook (NFTA_CHAIN_HOOK)
	hook    uint32 // base chains only
	prio    int32  // base chains only
	hasPrio bool
	typ     string // base chains only ("nat", "filter", ...)
	ofNatgw bool   // it is a chain of natgw's table
}

// tableFamilies reports whether natgw's table exists in its family (inet)
// and as the legacy table ip natgw (layouts 1-3): one dump of every
// family's tables.
func (r *Backend) tableFamilies(ctx context.Context) (inet, legacy bool, err error) {
	err = r.dumps().Dump(ctx, unix.NFT_MSG_GETTABLE, unix.NFPROTO_UNSPEC, nil, unix.NFT_MSG_NEWTABLE, func(fam uint8, b []byte) error {
		return nftconn.Attrs(b, func(typ uint16, v []byte) error {
			if typ == unix.NFTA_TABLE_NAME && nftconn.CString(v) == tableName {
				inet = inet || fam == nfFamily
				legacy = legacy || fam == unix.NFPROTO_IPV4
			}
			return nil
		})
	})
	if err != nil {
		return false, false, fmt.Errorf("list tables: %w", err)
	}
	return inet, legacy, nil
}

// dumpOf dumps the objects of one kind in natgw's family (request typ,
// replies of type reply; see nftconn.Socket.Dump) and returns those that decode
// decodes and keep keeps (all when keep is nil). what names the kind in
// errors.
func dumpOf[T any](ctx context.Context, r *Backend, what string, typ uint16, req []netlink.Attribute, reply uint16, decode func([]byte) (T, error), keep func(T) bool) ([]T, error) {
	var out []T
	err := r.dumps().Dump(ctx, typ, nfFamily, req, reply, func(_ uint8, b []byte) error {
		v, err := decode(b)
		if err != nil {
			return fmt.Errorf("decode: %w", err)
		}
		if keep == nil || keep(v) {
			out = append(out, v)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", what, err)
	}
	return out, nil
}

// kernelSets returns the sets of natgw's table by name.
func (r *Backend) kernelSets(ctx context.Context) (map[string]kernelSet, error) {
	list, err := dumpOf(ctx, r, "sets", unix.NFT_MSG_GETSET, []netlink.Attribute{
		{Type: unix.NFTA_SET_TABLE, Data: []byte(tableName + "\x00")},
	}, unix.NFT_MSG_NEWSET, decodeSet, nil)
	if err != nil {
		return nil, err
	}
	sets := make(map[string]kernelSet, len(list))
	for _, s := range list {
		sets[s.name] = s
	}
	return sets, nil
}

// decodeSet decodes the attributes of one NEWSET message (what
// setMismatch checks).
func decodeSet(b []byte) (kernelSet, error) {
	var s kernelSet
	err := nftconn.Attrs(b, func(typ uint16, v []byte) error {
		switch typ {
		case unix.NFTA_SET_NAME:
			s.name = nftconn.CString(v)
		case unix.NFTA_SET_FLAGS:
			f, err := nftconn.BE32(v)
			s.isMap = f&unix.NFT_SET_MAP != 0
			return err
		case unix.NFTA_SET_KEY_TYPE:
			return be32To(&s.keyType, v)
		case unix.NFTA_SET_KEY_LEN:
			return be32To(&s.keyLen, v)
		case unix.NFTA_SET_DATA_TYPE:
			return be32To(&s.dataType, v)
		case unix.NFTA_SET_DATA_LEN:
			return be32To(&s.dataLen, v)
		}
		return nil
	})
	return s, err
}

// kernelChains returns the chains of natgw's table (the dump holds every
// chain of the family; the others are left out).
func (r *Backend) kernelChains(ctx context.Context) ([]kernelChain, error) {
	return dumpOf(ctx, r, "chains", unix.NFT_MSG_GETCHAIN, nil, unix.NFT_MSG_NEWCHAIN, decodeChain,
		func(c kernelChain) bool { return c.ofNatgw })
}

// decodeChain decodes the attributes of one NEWCHAIN message.
func decodeChain(b []byte) (kernelChain, error) {
	var c kernelChain
	err := nftconn.Attrs(b, func(typ uint16, v []byte) error {
		switch typ {
		case unix.NFTA_CHAIN_TABLE:
			c.ofNatgw = nftconn.CString(v) == tableName
		case unix.NFTA_CHAIN_NAME:
			c.name = nftconn.CString(v)
		case unix.NFTA_CHAIN_TYPE:
			c.typ = nftconn.CString(v)
		case unix.NFTA_CHAIN_HOOK:
			c.base = true
			return nftconn.Attrs(v, func(typ uint16, v []byte) error {
				switch typ {
				case unix.NFTA_HOOK_HOOKNUM:
					return be32To(&c.hook, v)
				case unix.NFTA_HOOK_PRIORITY:
					p, err := nftconn.BE32(v)
					c.prio, c.hasPrio = int32(p), err == nil
					return err
				}
				return nil
			})
		}
		return nil
	})
	return c, err
}

// kernelObj is what Load reads of a stateful object of natgw's table.
type kernelObj struct {
	name string
	kind uint32 // NFT_OBJECT_LIMIT, ...
}

// kernelLimits returns the limit objects of natgw's table.
func (r *Backend) kernelLimits(ctx context.Context) ([]kernelObj, error) {
	return dumpOf(ctx, r, "objects", unix.NFT_MSG_GETOBJ, []netlink.Attribute{
		{Type: unix.NFTA_OBJ_TABLE, Data: []byte(tableName + "\x00")},
		{Type: unix.NFTA_OBJ_TYPE, Data: binary.BigEndian.AppendUint32(nil, unix.NFT_OBJECT_LIMIT)},
	}, unix.NFT_MSG_NEWOBJ, decodeObj, func(o kernelObj) bool { return o.kind == unix.NFT_OBJECT_LIMIT })
}

// decodeObj decodes the name and type of one NEWOBJ message.
func decodeObj(b []byte) (kernelObj, error) {
	var o kernelObj
	err := nftconn.Attrs(b, func(typ uint16, v []byte) error {
		switch typ {
		case unix.NFTA_OBJ_NAME:
			o.name = nftconn.CString(v)
		case unix.NFTA_OBJ_TYPE:
			return be32To(&o.kind, v)
		}
		return nil
	})
	return o, err
}

// be32To stores the big-endian uint32 attribute v in *p.
func be32To(p *uint32, v []byte) error {
	u, err := nftconn.BE32(v)
	*p = u
	return err
}
