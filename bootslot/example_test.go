package bootslot_test

import (
	"context"
	"log"
	"time"

	"github.com/vmshim/vmshim/bootslot"
)

// Example holds one of the node's four boot slots from before a VM's
// vCPUs run until its kernel is past its early boot.
func Example() {
	slots, err := bootslot.New("/run/vmshim/boot-slots", 4)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	slot, err := slots.Acquire(ctx)
	slots.Close()
	if err != nil {
		log.Fatal(err)
	}
	defer slot.Release()
	log.Printf("boot slot %d: resuming the vCPUs", slot.Index())
	// … resume the VM; once the guest's kernel is past its early boot:
	slot.Release()
}
