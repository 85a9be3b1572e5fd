package boltstore

import (
	"encoding/binary"
	"fmt"
	"io"
)

// bbolt's on-disk page layout (go.etcd.io/bbolt/internal/common, file format version 2),
// in the machine's byte order as bbolt writes it:
//
//	page header:    id uint64 | flags uint16 | count uint16 | overflow uint32   (16 bytes)
//	branch element: pos uint32 | ksize uint32 | pgid uint64                       (16 bytes)
//	leaf element:   flags uint32 | pos uint32 | ksize uint32 | vsize uint32       (16 bytes)
//	bucket value:   root uint64 | sequence uint64 [| inline leaf page if root == 0]
//
// An element's key starts pos bytes after the element itself; a leaf's value follows its key.
const (
	pageHeaderSize   = 16
	pageElementSize  = 16
	bucketHeaderSize = 16
	branchPageFlag   = 0x01
	leafPageFlag     = 0x02
	bucketLeafFlag   = 0x01
	maxTreeDepth     = 64
)

// validatePages walks the b-tree of a bbolt file from root, reading it with ReadAt (never
// through bbolt's memory map), and checks that every page and every key and value it
// references lies inside the file's pages: ids below the high-water mark hwm, no page
// reached twice, headers naming themselves, element counts, keys and values inside their
// page. bbolt trusts all of this, so that on a file that breaks it a read through the map
// can fault — and one in the goroutine bbolt's tx.Check runs in cannot be recovered: it
// kills the process. Open runs this first, so that tx.Check (and every later read) meets
// only a structurally sound file.
func validatePages(r io.ReaderAt, pageSize int, hwm, root uint64) error {
	v := &pageValidator{r: r, pageSize: uint64(pageSize), hwm: hwm, seen: map[uint64]bool{}}
	return v.page(root, 0)
}

type pageValidator struct {
	r        io.ReaderAt
	pageSize uint64
	hwm      uint64
	seen     map[uint64]bool
	bufs     [][]byte // one page buffer per tree level, reused
}

var ne = binary.NativeEndian

// page validates the page id (and its overflow pages) and everything below it.
func (v *pageValidator) page(id uint64, depth int) error {
	if depth > maxTreeDepth {
		return fmt.Errorf("page %d: b-tree deeper than %d levels", id, maxTreeDepth)
	}
	if id < 2 || id >= v.hwm {
		return fmt.Errorf("page id %d out of range [2, %d)", id, v.hwm)
	}
	var hdr [pageHeaderSize]byte
	if _, err := v.r.ReadAt(hdr[:], int64(id*v.pageSize)); err != nil {
		return fmt.Errorf("page %d: %w", id, err)
	}
	if got := ne.Uint64(hdr[0:]); got != id {
		return fmt.Errorf("page %d: its header says page %d", id, got)
	}
	overflow := uint64(ne.Uint32(hdr[12:]))
	if id+overflow >= v.hwm {
		return fmt.Errorf("page %d: %d overflow pages run past the high-water mark %d", id, overflow, v.hwm)
	}
	for i := id; i <= id+overflow; i++ {
		if v.seen[i] {
			return fmt.Errorf("page %d: referenced twice", i)
		}
		v.seen[i] = true
	}
	for len(v.bufs) <= depth {
		v.bufs = append(v.bufs, nil)
	}
	size := (overflow + 1) * v.pageSize
	if uint64(cap(v.bufs[depth])) < size {
		v.bufs[depth] = make([]byte, size)
	}
	buf := v.bufs[depth][:size]
	if _, err := v.r.ReadAt(buf, int64(id*v.pageSize)); err != nil {
		return fmt.Errorf("page %d: %w", id, err)
	}
	return v.nodePage(pageName{id: id}, buf, depth, true)
}

// pageName names a page in errors: page id, or the inline bucket at element elem of it.
type pageName struct {
	id     uint64
	inline bool
	elem   uint64
}

func (n pageName) String() string {
	if n.inline {
		return fmt.Sprintf("page %d: inline bucket %d", n.id, n.elem)
	}
	return fmt.Sprintf("page %d", n.id)
}

// nodePage validates a branch or leaf page held whole in buf (a page from the file, or an
// inline bucket's page, which must be a leaf).
func (v *pageValidator) nodePage(name pageName, buf []byte, depth int, branchOK bool) error {
	if len(buf) < pageHeaderSize {
		return fmt.Errorf("%s: %d bytes, shorter than a page header", name, len(buf))
	}
	flags, count := ne.Uint16(buf[8:]), uint64(ne.Uint16(buf[10:]))
	if pageHeaderSize+count*pageElementSize > uint64(len(buf)) {
		return fmt.Errorf("%s: %d elements do not fit in %d bytes", name, count, len(buf))
	}
	switch {
	case flags == branchPageFlag && branchOK:
		if count == 0 {
			return fmt.Errorf("%s: branch page with no elements", name)
		}
		for i := range count {
			off := pageHeaderSize + i*pageElementSize
			e := buf[off:]
			pos, ksize := uint64(ne.Uint32(e[0:])), uint64(ne.Uint32(e[4:]))
			if off+pos+ksize > uint64(len(buf)) {
				return fmt.Errorf("%s: branch element %d's key lies outside the page", name, i)
			}
			if err := v.page(ne.Uint64(e[8:]), depth+1); err != nil {
				return err
			}
		}
	case flags == leafPageFlag:
		for i := range count {
			off := pageHeaderSize + i*pageElementSize
			e := buf[off:]
			eflags := ne.Uint32(e[0:])
			pos, ksize, vsize := uint64(ne.Uint32(e[4:])), uint64(ne.Uint32(e[8:])), uint64(ne.Uint32(e[12:]))
			end := off + pos + ksize + vsize
			if end > uint64(len(buf)) {
				return fmt.Errorf("%s: leaf element %d's key or value lies outside the page", name, i)
			}
			if eflags&bucketLeafFlag == 0 {
				continue
			}
			val := buf[end-vsize : end]
			if len(val) < bucketHeaderSize {
				return fmt.Errorf("%s: leaf element %d is a bucket of %d bytes, shorter than a bucket header", name, i, len(val))
			}
			if root := ne.Uint64(val); root != 0 {
				if err := v.page(root, depth+1); err != nil {
					return err
				}
			} else if err := v.nodePage(pageName{id: name.id, inline: true, elem: i}, val[bucketHeaderSize:], depth+1, false); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("%s: unexpected page type (flags %#x)", name, flags)
	}
	return nil
}
