package dedupq

import (
	"context"
	"fmt"

	"github.com/dedupq/dedupq/driver"
)

// checkThenProvision is the order NewPublisher and NewConsumer open a
// backend in (see driver.Provisioner): read and check what the driver
// reports, which for state it has yet to create is what it will create;
// only when the check passes let the driver create it; then read and check
// again, because state another process created meanwhile is used as it is
// and may differ from the plan. read stores what it read for check.
//
// So a refused open creates nothing on the broker, and the same open with
// the policy fixed finds the broker as it was.
func checkThenProvision(ctx context.Context, drv any, read, check func() error) error {
	if err := read(); err != nil {
		return err
	}
	if err := check(); err != nil {
		return err
	}
	p, ok := drv.(driver.Provisioner)
	if !ok {
		return nil
	}
	if err := p.Provision(ctx); err != nil {
		return fmt.Errorf("dedupq: creating what the backend's configuration asks for: %w", err)
	}
	if err := read(); err != nil {
		return err
	}
	return check()
}
