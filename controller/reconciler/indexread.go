package reconciler

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// indexKey is the key controller-runtime's informer cache files a
// cluster-scoped object under in field index name's indexer: the index
// is named "field:"+name and its values carry the all-namespaces prefix
// (sigs.k8s.io/controller-runtime/pkg/cache/internal FieldIndexName and
// KeyToNamespacedKey with namespace ""). Every kind indexed here
// (RegisterIndexes) is cluster-scoped.
func indexKey(name, value string) (index, key string) {
	return "field:" + name, "__all_namespaces/" + value
}

// eachIndexed calls f with each cached object of obj's kind whose field
// index (RegisterIndexes) has value. With Deps.Informers set it reads the
// informer's indexer itself: the stored objects, no list slice and no
// copies (a map function runs once per event, and a typed list as long
// as an EIP's rules was most of the controller's allocations at scale).
// f must only read what it is given. Without Informers (tests building
// Deps on a plain client), or when the informer exposes no indexer, it
// lists list's kind through Client by the same index instead.
func (d *Deps) eachIndexed(ctx context.Context, obj client.Object, list client.ObjectList, index, value string, f func(client.Object)) error {
	if d.Informers != nil {
		inf, err := d.Informers.GetInformer(ctx, obj)
		if err != nil {
			return fmt.Errorf("informer of %T: %w", obj, err)
		}
		if ix, ok := inf.(interface{ GetIndexer() toolscache.Indexer }); ok {
			name, key := indexKey(index, value)
			items, err := ix.GetIndexer().ByIndex(name, key)
			if err != nil {
				return fmt.Errorf("index %s of %T: %w", index, obj, err)
			}
			for _, it := range items {
				if o, ok := it.(client.Object); ok {
					f(o)
				}
			}
			return nil
		}
	}
	// Read-only: the cache's objects, not deep copies.
	return d.eachListed(ctx, list, f, client.MatchingFields{index: value})
}

// eachListed lists list's kind through Client without deep copies and
// calls f with each item.
func (d *Deps) eachListed(ctx context.Context, list client.ObjectList, f func(client.Object), opts ...client.ListOption) error {
	if err := d.Client.List(ctx, list, append(opts, client.UnsafeDisableDeepCopy)...); err != nil {
		return err
	}
	return meta.EachListItem(list, func(it runtime.Object) error {
		if o, ok := it.(client.Object); ok {
			f(o)
		}
		return nil
	})
}

// eachCached calls f with every cached object of obj's kind, as
// eachIndexed does for one index value: from the informer's store itself
// with Deps.Informers (no list slice, no copies), else through Client's
// list of list's kind. f must only read what it is given.
func (d *Deps) eachCached(ctx context.Context, obj client.Object, list client.ObjectList, f func(client.Object)) error {
	if d.Informers != nil {
		inf, err := d.Informers.GetInformer(ctx, obj)
		if err != nil {
			return fmt.Errorf("informer of %T: %w", obj, err)
		}
		if ix, ok := inf.(interface{ GetIndexer() toolscache.Indexer }); ok {
			for _, it := range ix.GetIndexer().List() {
				if o, ok := it.(client.Object); ok {
					f(o)
				}
			}
			return nil
		}
	}
	return d.eachListed(ctx, list, f)
}
