/*
 * Delta Lake's log store for s3a:// that commits with a conditional PUT, so that a Spark
 * writer can share a table on S3 with other writers (delta-rs, other drivers).
 *
 * Delta's own S3 store (io.delta.storage.S3SingleDriverLogStore) checks that commit N does
 * not exist and then writes it with a plain PUT: two writers in different processes can both
 * pass the check, and the second PUT replaces the first writer's commit. delta-rs commits
 * with a PUT carrying "If-None-Match: *", which the store refuses (412) when the key exists.
 * This store does the same, through the S3 client s3a already configured (endpoint,
 * addressing, credentials), and turns the refusal into the FileAlreadyExistsException Delta's
 * optimistic transaction expects: it re-reads the log and retries at the next version.
 * Reads and listings are Hadoop's (S3's listings are strongly consistent).
 *
 * Built by jobs/spark/s3.py and named by spark.delta.logStore.s3a.impl; docs/tables.md,
 * "Object storage".
 */
package io.bkaudit.delta;

import io.delta.storage.HadoopFileSystemLogStore;
import java.io.IOException;
import java.io.InterruptedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.util.Iterator;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.s3a.S3AFileSystem;
import software.amazon.awssdk.core.exception.SdkException;
import software.amazon.awssdk.core.sync.RequestBody;
import software.amazon.awssdk.services.s3.S3Client;
import software.amazon.awssdk.services.s3.model.PutObjectRequest;
import software.amazon.awssdk.services.s3.model.S3Exception;

public final class ConditionalPutLogStore extends HadoopFileSystemLogStore {
  /** S3's answer when the key exists (412), or when another conditional write to it is in flight (409). */
  private static final int PRECONDITION_FAILED = 412;
  private static final int CONDITIONAL_CONFLICT = 409;

  public ConditionalPutLogStore(Configuration hadoopConf) {
    super(hadoopConf);
  }

  @Override
  public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
      throws IOException {
    byte[] body = join(actions);
    FileSystem fs = path.getFileSystem(hadoopConf);
    if (overwrite) {
      // _last_checkpoint and the like: replacing is what the caller asked for.
      try (FSDataOutputStream out = fs.create(path, true)) {
        out.write(body);
      }
      return;
    }
    if (!(fs instanceof S3AFileSystem)) {
      throw new IOException(
          "ConditionalPutLogStore commits only to s3a:// (got " + fs.getScheme() + " for " + path + ")");
    }
    S3AFileSystem s3a = (S3AFileSystem) fs;
    S3Client client = s3a.getS3AInternals().getAmazonS3Client("bkaudit conditional Delta commit");
    PutObjectRequest request =
        PutObjectRequest.builder()
            .bucket(s3a.getBucket())
            .key(s3a.pathToKey(path))
            .overrideConfiguration(o -> o.putHeader("If-None-Match", "*"))
            .build();
    try {
      client.putObject(request, RequestBody.fromBytes(body));
    } catch (S3Exception e) {
      if (e.statusCode() == PRECONDITION_FAILED || e.statusCode() == CONDITIONAL_CONFLICT) {
        throw new FileAlreadyExistsException(path.toString());
      }
      throw new IOException("Delta commit " + path + ": " + e.getMessage(), e);
    } catch (SdkException e) {
      if (Thread.currentThread().isInterrupted()) {
        throw new InterruptedIOException("Delta commit " + path + " interrupted");
      }
      throw new IOException("Delta commit " + path + ": " + e.getMessage(), e);
    }
  }

  @Override
  public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
    // One PUT: the object appears whole or not at all.
    return false;
  }

  private static byte[] join(Iterator<String> actions) {
    StringBuilder text = new StringBuilder();
    while (actions.hasNext()) {
      text.append(actions.next()).append('\n');
    }
    return text.toString().getBytes(StandardCharsets.UTF_8);
  }
}
