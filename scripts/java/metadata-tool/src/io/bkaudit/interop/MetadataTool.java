package io.bkaudit.interop;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import org.apache.bookkeeper.client.BookKeeper;
import org.apache.bookkeeper.client.LedgerHandle;
import org.apache.bookkeeper.client.LedgerMetadataBuilder;
import org.apache.bookkeeper.client.api.LedgerMetadata;
import org.apache.bookkeeper.conf.ClientConfiguration;
import org.apache.bookkeeper.meta.LedgerMetadataSerDe;
import org.apache.bookkeeper.net.BookieId;

/**
 * One-shot helper for bkaudit's metadata format tests, run against the installed BookKeeper jars.
 *
 * <pre>
 * golden-v1 DIR        write BookKeeper's own LedgerMetadataSerDe.serialize output for format-v1
 *                      metadata (closed with three segments, open with two, in recovery, closed
 *                      empty) into DIR/ledger-v1-*.bin; tests/data/metadata/README.md has the
 *                      command and tests/unit/test_meta_v1_golden.py compares bklib's bytes
 * write URI E WQ AQ DIGEST PASSWORD_B64 FORMAT_VERSION CLOSE
 *                      create a ledger with the Java client configured with
 *                      ledgerMetadataVersion=FORMAT_VERSION, add the base64 payloads read from
 *                      stdin (one a line), close it if CLOSE is true; print the ledger id
 * </pre>
 */
public final class MetadataTool {
    private MetadataTool() {
    }

    public static void main(String[] args) throws Exception {
        if (args.length == 2 && "golden-v1".equals(args[0])) {
            goldenV1(Paths.get(args[1]));
        } else if (args.length == 9 && "write".equals(args[0])) {
            write(args);
            // A ledger left open stays open: no close, no shutdown hooks (a writer crash).
            Runtime.getRuntime().halt(0);
        } else {
            System.err.println("usage: golden-v1 DIR | write URI E WQ AQ DIGEST PASSWORD_B64 VERSION CLOSE");
            System.exit(2);
        }
    }

    private static List<BookieId> ensemble(String... ids) {
        List<BookieId> out = new ArrayList<>();
        for (String id : ids) {
            out.add(BookieId.parse(id));
        }
        return out;
    }

    /** The vectors; ids, quorums and entries are fixed so the bytes are reproducible. */
    private static void goldenV1(Path dir) throws Exception {
        Files.createDirectories(dir);
        LedgerMetadataSerDe serde = new LedgerMetadataSerDe();
        // Closed, three segments (two ensemble changes), E=3 WQ=2 (v1 has no ack quorum: AQ=WQ).
        LedgerMetadata closed = LedgerMetadataBuilder.create()
                .withId(4242L).withMetadataFormatVersion(1)
                .withEnsembleSize(3).withWriteQuorumSize(2).withAckQuorumSize(2)
                .newEnsembleEntry(0L, ensemble("10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181"))
                .newEnsembleEntry(17L, ensemble("10.0.0.1:3181", "10.0.0.4:3181", "10.0.0.3:3181"))
                .newEnsembleEntry(1000L, ensemble("bookie-5.example:3181", "10.0.0.4:3181", "10.0.0.3:3181"))
                .withClosedState().withLastEntryId(1234L).withLength(98765L)
                .build();
        // Open, two segments, E=2 WQ=2.
        LedgerMetadata open = LedgerMetadataBuilder.create()
                .withId(7L).withMetadataFormatVersion(1)
                .withEnsembleSize(2).withWriteQuorumSize(2).withAckQuorumSize(2)
                .newEnsembleEntry(0L, ensemble("127.0.0.1:3181", "127.0.0.1:3182"))
                .newEnsembleEntry(5L, ensemble("127.0.0.1:3183", "127.0.0.1:3182"))
                .build();
        // In recovery (written as the line "-102\tCLOSED"), one segment, E=4 WQ=3.
        LedgerMetadata recovering = LedgerMetadataBuilder.create()
                .withId(99L).withMetadataFormatVersion(1)
                .withEnsembleSize(4).withWriteQuorumSize(3).withAckQuorumSize(3)
                .newEnsembleEntry(0L, ensemble("b1:1", "b2:2", "b3:3", "b4:4"))
                .withInRecoveryState()
                .build();
        // Closed with no entries (lastEntryId -1), one segment, E=1 WQ=1.
        LedgerMetadata empty = LedgerMetadataBuilder.create()
                .withId(1L).withMetadataFormatVersion(1)
                .withEnsembleSize(1).withWriteQuorumSize(1).withAckQuorumSize(1)
                .newEnsembleEntry(0L, ensemble("127.0.0.1:3181"))
                .withClosedState().withLastEntryId(-1L).withLength(0L)
                .build();
        Object[][] vectors = {
            {"ledger-v1-closed-3-segments.bin", closed},
            {"ledger-v1-open-2-segments.bin", open},
            {"ledger-v1-in-recovery.bin", recovering},
            {"ledger-v1-closed-empty.bin", empty},
        };
        for (Object[] v : vectors) {
            byte[] bytes = serde.serialize((LedgerMetadata) v[1]);
            Files.write(dir.resolve((String) v[0]), bytes);
            System.out.println(v[0] + " " + bytes.length + " bytes");
        }
    }

    private static void write(String[] args) throws Exception {
        ClientConfiguration conf = new ClientConfiguration();
        conf.setMetadataServiceUri(args[1]);
        conf.setZkTimeout(10000);
        conf.setAddEntryTimeout(10);
        conf.setLedgerMetadataFormatVersion(Integer.parseInt(args[7]));
        String digestName = "HMAC".equals(args[5]) ? "MAC" : args[5];
        BookKeeper bk = new BookKeeper(conf);
        try {
            LedgerHandle lh = bk.createLedger(Integer.parseInt(args[2]), Integer.parseInt(args[3]),
                    Integer.parseInt(args[4]), BookKeeper.DigestType.valueOf(digestName),
                    Base64.getDecoder().decode(args[6]));
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.US_ASCII));
            for (String line = in.readLine(); line != null; line = in.readLine()) {
                if (!line.isEmpty()) {
                    lh.addEntry(Base64.getDecoder().decode(line));
                }
            }
            if (Boolean.parseBoolean(args[8])) {
                lh.close();
            }
            System.out.println(lh.getId());
            System.out.flush();
        } finally {
            if (Boolean.parseBoolean(args[8])) {
                bk.close();
            }
        }
    }
}
