//! `convert` (cryptsetup convert): LUKS1 to LUKS2 and back, in place.

use super::{header_path, load, open_header};
use crate::args::HeaderArgs;
use crate::ctx::Ctx;
use crate::error::{CliError, CliResult};
use crate::passphrase::confirm;
use clap::Args;
use cryptblk_volume::VolumeType;
use std::path::PathBuf;

/// `cryptsetup erase`: wipes every keyslot, after which no passphrase opens the volume
/// (the data is unreadable for good: crypto-shredding).
#[derive(Args, Debug)]
pub(crate) struct ConvertArgs {
    /// Image file or block device.
    pub device: PathBuf,
    #[command(flatten)]
    pub header: HeaderArgs,
    /// The version to convert to: luks1 or luks2.
    #[arg(long = "type", short = 'M', value_enum)]
    pub kind: VolumeType,
}

/// `convert --type luks1|luks2` (cryptsetup's checks and messages). The device is locked
/// exclusively: a volume being served is never converted behind its server's back.
pub(crate) fn convert(ctx: &Ctx, a: ConvertArgs) -> CliResult<()> {
    use cryptblk_format::luks1::Luks1Header;
    use cryptblk_format::luks2::Luks2Header;
    let to: u8 = match a.kind {
        VolumeType::Luks1 => 1,
        VolumeType::Luks2 => 2,
        _ => {
            return Err(CliError::usage(
                "Invalid LUKS type, only luks1 and luks2 are supported.",
            ));
        }
    };
    let path = header_path(&a.device, &a.header).to_path_buf();
    let mut dev = open_header(ctx, &a.device, &a.header, true)?;
    let from = load(&mut dev, &path)?.version();
    if from == to {
        return Err(CliError::usage(format!("Device is already LUKS{to} type.")));
    }
    confirm(
        ctx.batch,
        &format!(
            "This operation will convert {} to LUKS{to} format.",
            path.display()
        ),
    )?;
    if to == 2 {
        let v1 = Luks1Header::read(&mut dev)?;
        Luks2Header::convert_from_luks1(&mut dev, &v1)?;
    } else {
        let v2 = Luks2Header::read(&mut dev)?;
        v2.convert_to_luks1(&mut dev)?;
    }
    Ok(())
}
