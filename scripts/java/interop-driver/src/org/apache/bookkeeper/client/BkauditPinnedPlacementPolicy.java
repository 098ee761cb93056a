package org.apache.bookkeeper.client;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.bookkeeper.client.BKException.BKNotEnoughBookiesException;
import org.apache.bookkeeper.net.BookieId;

/**
 * BookKeeper's default placement, except that the driver can pin the next new ensemble: the
 * interop tests need a Java writer on exactly the Python (or exactly the Java) bookies of a
 * mixed cluster. Ensemble changes (replaceBookie) stay the default policy's. It lives in
 * BookKeeper's package because the default policy's constructor is package-private.
 */
public class BkauditPinnedPlacementPolicy extends DefaultEnsemblePlacementPolicy {
    private static volatile List<BookieId> pinned;

    public static void pin(List<BookieId> bookies) {
        pinned = bookies;
    }

    @Override
    public PlacementResult<List<BookieId>> newEnsemble(int ensembleSize, int quorumSize, int ackQuorumSize,
            Map<String, byte[]> customMetadata, Set<BookieId> excludeBookies)
            throws BKNotEnoughBookiesException {
        List<BookieId> p = pinned;
        if (p == null) {
            return super.newEnsemble(ensembleSize, quorumSize, ackQuorumSize, customMetadata, excludeBookies);
        }
        if (p.size() != ensembleSize) {
            throw new BKNotEnoughBookiesException();
        }
        return PlacementResult.of(new ArrayList<>(p), PlacementPolicyAdherence.MEETS_STRICT);
    }
}
